//! A `Watch { scope, after, wait_ms }`: the cursor rules of reading a DC's
//! event log for a watcher, as a sans-IO [`Stepper`]. The driver reads pages
//! and parks the request; this decides what each page means:
//!
//! - a cursor of 0 starts from the oldest event kept; any other cursor must
//!   not point before it (the watcher would miss trimmed events: refused
//!   `Trimmed` with where to resume) nor past the log's head (a cursor of
//!   another DC or another log: refused) — checked on every page, since
//!   the log may be trimmed under a round (what was read before the gap is
//!   answered, and the next request is refused);
//! - only events in the scope are answered, at most [`WATCH_REPLY_BYTES_MAX`]
//!   encoded bytes of them; the cursor moves past every event read, in the
//!   scope or not, so a watcher of a quiet scope does not re-read a busy
//!   log's other events;
//! - a round reads on while pages come back full, at most
//!   [`WATCH_PAGES_MAX`] pages: a round that reads that many without
//!   reaching the head answers at once (perhaps no events, but a moved
//!   cursor) instead of parking;
//! - a round that reaches the head with nothing in scope parks until the
//!   log moves or the wait runs out ([`Effect::AwaitLog`]), then reads
//!   again from where it stopped; a wait that ran out (or the node shutting
//!   down) answers the cursor as it stands.
//!
//! ```text
//! Read ─ page ─► (cursor bad) Done(Err)
//!   │  └─ page full, pages left this round ─► Read (next page)
//!   │  └─ events in scope, or the page bound reached ─► Done(Ok)
//!   └─ head reached, nothing in scope ─► (wait over ─► Done(Ok))
//!        AwaitLog ─ log moved ─► Read
//!                 └ wait over, closed ─► Done(Ok)
//!                 └ too many parked ─► Done(Err(Overloaded))
//! ```

use homing_core::{ErrorKind, ErrorReply, Event, EventSeq, NamespaceScope, wire};

use crate::step::effect::{StoreOp, Stored};
use crate::step::time::NodeTime;
use crate::step::{Answer, Effect, Now, Step, Stepper};
use homing_core::{Mutation, Mutations};

/// Most encoded bytes of events one `Watch` reply carries (the rest of the
/// 64 KiB frame is headroom).
pub const WATCH_REPLY_BYTES_MAX: usize = 48 * 1024;
/// Most event pages one round of a `Watch` reads looking for events in its
/// scope before answering with none (but a moved cursor).
pub const WATCH_PAGES_MAX: usize = 8;

/// The events in scope and the cursor to resume from, or why the cursor
/// cannot be served.
pub type Watched = Result<(Vec<Event>, EventSeq), ErrorReply>;

#[derive(Debug, Clone, PartialEq, Eq)]
enum Phase {
    /// Read the events after the cursor.
    Read(StoreOp),
    /// Nothing in scope up to the head: wait for the log to move.
    Park,
    Done(Watched),
    Over,
}

/// One `Watch` request's reading of the log.
#[derive(Debug)]
pub struct WatchRead {
    scope: NamespaceScope,
    /// The last event read (in scope or not).
    after: EventSeq,
    page_limit: usize,
    /// When the request's wait runs out (node clock).
    deadline: NodeTime,
    /// Events in scope found this round, and their encoded bytes.
    events: Vec<Event>,
    bytes: usize,
    /// Pages read this round.
    pages: usize,
    phase: Phase,
    mutations: Mutations,
}

impl WatchRead {
    /// A watch of `scope` from cursor `after` arriving at `now`, waiting at
    /// most `wait_ms` (capped at `WAIT_MS_MAX`) for an event, reading pages
    /// of `page_limit` events (the store's page bound).
    pub fn new(
        scope: NamespaceScope,
        after: EventSeq,
        wait_ms: u32,
        now: NodeTime,
        page_limit: usize,
    ) -> WatchRead {
        WatchRead {
            scope,
            after,
            page_limit,
            deadline: now.plus_ms(u64::from(wait_ms.min(wire::WAIT_MS_MAX))),
            events: Vec::new(),
            bytes: 0,
            pages: 0,
            phase: Phase::Read(StoreOp::Events {
                after,
                limit: page_limit,
            }),
            mutations: Mutations::NONE,
        }
    }

    /// This watch with `mutations`' rules broken (tests only).
    pub fn with_mutations(self, mutations: Mutations) -> WatchRead {
        WatchRead { mutations, ..self }
    }

    /// A page of events after the cursor, with the oldest event kept and the
    /// log's head.
    fn handle_page(&mut self, events: Vec<Event>, oldest: EventSeq, head: EventSeq) {
        // Every page, not only the first: the log may have been trimmed
        // past the cursor between two pages or while parked.
        let unchecked = self.pages > 0 && self.mutations.has(Mutation::WatchChecksFirstPageOnly);
        if !unchecked && let Err(refusal) = self.check_cursor(oldest, head) {
            self.phase = if self.events.is_empty() {
                Phase::Done(Err(refusal))
            } else {
                // Answer what was read before the gap; the next request,
                // from this cursor, is refused.
                self.found()
            };
            return;
        }
        self.pages += 1;
        let full = events.len() >= self.page_limit;
        for event in events {
            if event.seq <= self.after {
                continue;
            }
            if self.scope.contains(&event.key.namespace) {
                let size = wire::encode(&event).map_or(usize::MAX, |b| b.len());
                if self.bytes.saturating_add(size) > WATCH_REPLY_BYTES_MAX {
                    // This event starts the next reply.
                    self.phase = self.found();
                    return;
                }
                self.bytes += size;
                self.events.push(event.clone());
            }
            self.after = event.seq;
        }
        self.phase = if full && self.pages < WATCH_PAGES_MAX {
            Phase::Read(StoreOp::Events {
                after: self.after,
                limit: self.page_limit,
            })
        } else if !self.events.is_empty() || full {
            // Events found, or pages read without reaching the head: answer
            // now (with a moved cursor) rather than wait for a change.
            self.found()
        } else {
            Phase::Park
        };
    }

    /// The log moved while parked: read again from the cursor (a new round).
    fn handle_moved(&mut self) {
        self.pages = 0;
        self.phase = Phase::Read(StoreOp::Events {
            after: self.after,
            limit: self.page_limit,
        });
    }

    /// What this round found, with the cursor as it stands.
    fn found(&mut self) -> Phase {
        Phase::Done(Ok((std::mem::take(&mut self.events), self.after)))
    }

    fn check_cursor(&self, oldest: EventSeq, head: EventSeq) -> Result<(), ErrorReply> {
        let after = self.after;
        if after > 0 && after + 1 < oldest {
            return Err(ErrorReply::new(
                ErrorKind::Trimmed { oldest },
                format!(
                    "events {}..{} were trimmed (events_retained); resume from {}",
                    after + 1,
                    oldest - 1,
                    oldest - 1
                ),
            ));
        }
        if after > head {
            return Err(ErrorReply::new(
                ErrorKind::BadRequest,
                format!(
                    "cursor {after} is beyond this dc's last event {head}: a cursor of another dc or another log"
                ),
            ));
        }
        Ok(())
    }
}

impl Stepper for WatchRead {
    type Output = Watched;

    fn step(&mut self, now: NodeTime) -> Step<Watched> {
        if self.phase == Phase::Park && now >= self.deadline {
            // The wait ran out: answer the cursor as it stands.
            self.phase = self.found();
        }
        match std::mem::replace(&mut self.phase, Phase::Over) {
            Phase::Read(op) => {
                self.phase = Phase::Read(op.clone());
                Step::Ask(Effect::Store(op))
            }
            Phase::Park => {
                self.phase = Phase::Park;
                Step::Ask(Effect::AwaitLog {
                    until: self.deadline,
                })
            }
            Phase::Done(done) => Step::Done(done),
            Phase::Over => panic!("watch stepped after it ended"),
        }
    }

    fn answer(&mut self, answer: Answer, _now: Now) {
        match (&self.phase, answer) {
            (
                Phase::Read(_),
                Answer::Stored(Ok(Stored::Events {
                    events,
                    oldest,
                    head,
                })),
            ) => self.handle_page(events, oldest, head),
            (Phase::Read(_), Answer::Stored(Err(failure)))
            | (Phase::Park, Answer::LogMoved(Err(failure))) => {
                self.phase = Phase::Done(Err(failure.into_reply()));
            }
            (Phase::Park, Answer::LogMoved(Ok(()))) => self.handle_moved(),
            (Phase::Park, Answer::TimedOut | Answer::Closed) => self.phase = self.found(),
            (phase, answer) => {
                panic!("watch: an answer it did not ask for in {phase:?}: {answer:?}")
            }
        }
    }
}
#[cfg(test)]
mod tests {
    use super::*;
    use crate::step::failure::Failure;
    use homing_core::{EventKind, FencingToken, Key, KeyName, Namespace, StoreTime};

    const NOW: Now = Now {
        node: T0,
        store: StoreTime::from_ms(1_000),
    };

    const PAGE: usize = 4;

    fn event(seq: EventSeq, namespace: &str) -> Event {
        Event {
            seq,
            reservation: format!("iad.{seq}").parse().unwrap(),
            key: Key {
                namespace: Namespace::new(namespace).unwrap(),
                ..Key::new(KeyName::new(format!("k{seq}-{}", "x".repeat(100))).unwrap())
            },
            token: FencingToken::FIRST,
            kind: EventKind::Drained,
        }
    }

    fn games() -> NamespaceScope {
        NamespaceScope::exact(Namespace::new("games").unwrap())
    }

    const T0: NodeTime = NodeTime::from_us(1_000_000);
    const WAIT_MS: u32 = 1_000;

    fn read_from(after: EventSeq, page_limit: usize) -> WatchRead {
        WatchRead::new(games(), after, WAIT_MS, T0, page_limit)
    }

    fn done(read: &WatchRead) -> Result<(Vec<EventSeq>, EventSeq), ErrorKind> {
        match &read.phase {
            Phase::Done(Ok((events, next))) => Ok((events.iter().map(|e| e.seq).collect(), *next)),
            Phase::Done(Err(e)) => Err(e.kind.clone()),
            other => panic!("not done: {other:?}"),
        }
    }

    #[test]
    fn a_cursor_before_the_oldest_kept_event_is_refused_with_where_to_resume() {
        let mut read = read_from(3, PAGE);
        read.handle_page(vec![event(10, "games")], 10, 10);
        assert_eq!(done(&read), Err(ErrorKind::Trimmed { oldest: 10 }));
        // Cursor 0 starts from the oldest kept; 9 resumes exactly there.
        for after in [0, 9] {
            let mut read = read_from(after, PAGE);
            read.handle_page(vec![event(10, "games")], 10, 10);
            assert_eq!(done(&read), Ok((vec![10], 10)));
        }
    }

    #[test]
    fn a_cursor_past_the_head_is_refused() {
        let mut read = read_from(11, PAGE);
        read.handle_page(vec![], 1, 10);
        assert_eq!(done(&read), Err(ErrorKind::BadRequest));
    }

    #[test]
    fn only_events_in_scope_are_answered_and_the_cursor_passes_the_others() {
        let mut read = read_from(0, PAGE);
        let page = vec![event(1, "chat"), event(2, "games"), event(3, "chat")];
        read.handle_page(page, 1, 3);
        assert_eq!(done(&read), Ok((vec![2], 3)));
    }

    #[test]
    fn nothing_in_scope_up_to_the_head_parks_then_reads_on_from_the_cursor() {
        let mut read = read_from(0, PAGE);
        read.handle_page(vec![event(1, "chat")], 1, 1);
        assert_eq!(read.phase, Phase::Park);
        read.handle_moved();
        assert_eq!(
            read.phase,
            Phase::Read(StoreOp::Events {
                after: 1,
                limit: PAGE
            })
        );
        read.handle_page(vec![event(2, "games")], 1, 2);
        assert_eq!(done(&read), Ok((vec![2], 2)));
    }

    #[test]
    fn a_round_of_full_pages_out_of_scope_answers_at_the_bound_with_a_moved_cursor() {
        let mut read = read_from(0, PAGE);
        let mut seq = 0;
        for _ in 0..WATCH_PAGES_MAX {
            let page: Vec<Event> = (0..PAGE)
                .map(|_| {
                    seq += 1;
                    event(seq, "chat")
                })
                .collect();
            assert!(matches!(read.phase, Phase::Read(StoreOp::Events { .. })));
            read.handle_page(page, 1, 1_000);
        }
        let read_events = (WATCH_PAGES_MAX * PAGE) as EventSeq;
        assert_eq!(done(&read), Ok((vec![], read_events)));
    }

    #[test]
    fn a_reply_stops_at_its_byte_bound_and_the_next_starts_at_the_first_left_out() {
        let mut read = read_from(0, 1_000);
        let page: Vec<Event> = (1..=1_000).map(|s| event(s, "games")).collect();
        read.handle_page(page, 1, 1_000);
        let (events, next) = done(&read).unwrap();
        assert!(
            !events.is_empty() && events.len() < 1_000,
            "{}",
            events.len()
        );
        assert_eq!(
            next,
            *events.last().unwrap(),
            "resume right after the last answered"
        );
    }

    #[test]
    fn events_trimmed_under_a_round_are_never_skipped_silently() {
        // Between two pages of one round, or while parked, the upkeep may
        // trim past the cursor: the next page starts after a gap.
        let mut read = read_from(0, PAGE);
        read.handle_page((1..=4).map(|s| event(s, "games")).collect(), 1, 20);
        assert!(matches!(
            read.phase,
            Phase::Read(StoreOp::Events { after: 4, .. })
        ));
        read.handle_page((10..=13).map(|s| event(s, "games")).collect(), 10, 20);
        // What was read before the gap is answered; the next request, from
        // 4, is refused `Trimmed` with where to resume.
        assert_eq!(done(&read), Ok((vec![1, 2, 3, 4], 4)));
        let mut next = read_from(4, PAGE);
        next.handle_page((10..=13).map(|s| event(s, "games")).collect(), 10, 20);
        assert_eq!(done(&next), Err(ErrorKind::Trimmed { oldest: 10 }));
        // Nothing read yet this round (parked, out of scope): refused at once.
        let mut parked = read_from(0, PAGE);
        parked.handle_page(vec![event(1, "chat")], 1, 1);
        assert_eq!(parked.phase, Phase::Park);
        parked.handle_moved();
        parked.handle_page(vec![event(5, "games")], 5, 5);
        assert_eq!(done(&parked), Err(ErrorKind::Trimmed { oldest: 5 }));
    }

    #[test]
    fn a_wait_that_runs_out_answers_the_cursor_as_it_stands() {
        let mut read = read_from(0, PAGE);
        read.handle_page(vec![event(1, "chat"), event(2, "chat")], 1, 2);
        assert_eq!(read.phase, Phase::Park);
        let deadline = T0.plus_ms(u64::from(WAIT_MS));
        let parked = Effect::AwaitLog { until: deadline };
        assert_eq!(read.step(T0), Step::Ask(parked.clone()));
        // Stepped again at the deadline (the driver's timer), or answered
        // that the wait ran out or the node closes: the cursor as it stands.
        assert_eq!(read.step(deadline), Step::Done(Ok((vec![], 2))));
        for ended in [Answer::TimedOut, Answer::Closed] {
            let mut read = read_from(0, PAGE);
            read.handle_page(vec![event(1, "chat")], 1, 1);
            assert_eq!(read.step(T0), Step::Ask(parked.clone()));
            read.answer(ended, NOW);
            assert_eq!(read.step(T0), Step::Done(Ok((vec![], 1))));
        }
    }

    #[test]
    fn a_watch_the_node_cannot_park_is_refused_overloaded() {
        let mut read = read_from(0, PAGE);
        read.handle_page(vec![event(1, "chat")], 1, 1);
        assert!(matches!(read.step(T0), Step::Ask(Effect::AwaitLog { .. })));
        let full = ErrorReply::new(ErrorKind::Overloaded, "watches_parked_max");
        read.answer(Answer::LogMoved(Err(Failure::Refused(full))), NOW);
        assert_eq!(done(&read), Err(ErrorKind::Overloaded));
    }
}
