//! Following the DC's event log, so that a write by any homingd of the DC
//! wakes the waiters and watchers of every one of them (DESIGN.md §7.1;
//! several homingd may serve one DC over a shared DC store).
//!
//! A homingd learns of its own writes as it makes them ([`crate::Waiters::written`]);
//! another instance's write reaches it only through the store. Every change
//! a waiter waits for appends an event (a release, an expiry, a link, an
//! abandon, a re-activation), so the follower reads the log after the last
//! event it saw and, for each event of a reservation with waiters here,
//! asks the driver to read the record as stored now and hand it to them
//! ([`crate::Waiters::notify`]). Parked watchers re-read on any new event.
//!
//! A follower that fell behind the log's trimming (it cannot know which
//! records the trimmed events were of) looks again at every reservation
//! with waiters here.

use homing_core::{Event, EventSeq, Mutation, ReservationId};

use crate::dc::waiters::Waiters;

/// Most events the follower reads at once.
pub const FOLLOW_PAGE_EVENTS: usize = 256;

/// Where a follower is in its DC's log.
#[derive(Debug, Clone, Default)]
pub struct LogFollower {
    /// The last event handled; `None` until the first page says where the
    /// log's head is (events from before the follower started woke nobody
    /// here: nobody could have waited for them).
    cursor: Option<EventSeq>,
}

/// What one page of the log asks of the driver.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Followed {
    /// Reservations whose waiters here must see the record as stored now,
    /// each once, in the order their events came.
    pub look: Vec<ReservationId>,
    /// New events: parked watchers re-read the log.
    pub events: bool,
    /// The page was full: read the next one at once instead of waiting.
    pub more: bool,
}

impl LogFollower {
    /// A follower that starts at the log's head, as the first page tells it.
    pub fn new() -> LogFollower {
        LogFollower::default()
    }

    /// The cursor to read the next page after (the first read starts from
    /// the oldest event kept, only to learn the head).
    pub fn after(&self) -> EventSeq {
        self.cursor.unwrap_or(0)
    }

    /// How many events to ask for.
    pub fn limit(&self) -> usize {
        if self.cursor.is_some() {
            FOLLOW_PAGE_EVENTS
        } else {
            1
        }
    }

    /// A page read after [`LogFollower::after`]: `events` in order, `oldest`
    /// the oldest event kept, `head` the last appended. `waiters` are this
    /// node's parked acquirers.
    pub fn handle_page<W>(
        &mut self,
        events: &[Event],
        oldest: EventSeq,
        head: EventSeq,
        waiters: &Waiters<W>,
    ) -> Followed {
        let Some(cursor) = self.cursor else {
            self.cursor = Some(head);
            return Followed::default();
        };
        let mut out = Followed::default();
        if cursor + 1 < oldest {
            // Trimmed before this follower read them: any record may have changed.
            out.look = waiters.reservations().cloned().collect();
            out.events = true;
            self.cursor = Some(oldest - 1);
        }
        for event in events {
            if event.seq <= self.after() {
                continue;
            }
            out.events = true;
            if waiters.has_waiters(&event.reservation) && !out.look.contains(&event.reservation) {
                out.look.push(event.reservation.clone());
            }
            self.cursor = Some(event.seq);
        }
        out.more = events.len() >= FOLLOW_PAGE_EVENTS && self.after() < head;
        if waiters.mutations().has(Mutation::FollowerWakesNobody) {
            out.look.clear();
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::dc::waiters::WaitLimits;
    use homing_core::Mutations;
    use homing_core::{EventKind, FencingToken, Key, KeyName};

    fn id(n: u64) -> ReservationId {
        format!("iad.{n}").parse().unwrap()
    }

    fn event(seq: EventSeq, reservation: u64) -> Event {
        Event {
            seq,
            reservation: id(reservation),
            key: Key::new(KeyName::new(format!("k{reservation}")).unwrap()),
            token: FencingToken::new(1),
            kind: EventKind::Drained,
        }
    }

    fn waiting_on(ids: &[u64]) -> Waiters<()> {
        let limits = WaitLimits {
            per_key: 8,
            total: 64,
            handoff_ms: 100,
        };
        let mut waiters = Waiters::new(limits, Mutations::NONE);
        for n in ids {
            waiters.register(&id(*n), ()).unwrap();
        }
        waiters
    }

    #[test]
    fn the_first_page_only_places_the_cursor_at_the_head() {
        let mut follower = LogFollower::new();
        assert_eq!((follower.after(), follower.limit()), (0, 1));
        let followed = follower.handle_page(&[event(3, 1)], 3, 9, &waiting_on(&[1]));
        assert_eq!(followed, Followed::default());
        assert_eq!(
            (follower.after(), follower.limit()),
            (9, FOLLOW_PAGE_EVENTS)
        );
    }

    #[test]
    fn events_of_reservations_with_waiters_are_looked_at_once_each() {
        let mut follower = LogFollower::new();
        let waiters = waiting_on(&[2, 3]);
        follower.handle_page(&[], 1, 4, &waiters);
        let page = [event(5, 1), event(6, 3), event(7, 2), event(8, 3)];
        let followed = follower.handle_page(&page, 1, 8, &waiters);
        assert_eq!(followed.look, vec![id(3), id(2)]);
        assert!(followed.events && !followed.more);
        assert_eq!(follower.after(), 8);
        // Read again (a slow page answered twice): nothing new.
        let again = follower.handle_page(&page, 1, 8, &waiters);
        assert_eq!(again, Followed::default());
    }

    #[test]
    fn a_follower_behind_the_trimming_looks_at_every_reservation_with_waiters() {
        let mut follower = LogFollower::new();
        let waiters = waiting_on(&[1, 2]);
        follower.handle_page(&[], 1, 4, &waiters);
        // Events 5..=9 were trimmed before this read.
        let followed = follower.handle_page(&[event(10, 7)], 10, 10, &waiters);
        assert_eq!(followed.look, vec![id(1), id(2)]);
        assert!(followed.events);
        assert_eq!(follower.after(), 10);
    }

    #[test]
    fn a_full_page_short_of_the_head_reads_on_at_once() {
        let mut follower = LogFollower::new();
        let waiters = waiting_on(&[]);
        follower.handle_page(&[], 1, 0, &waiters);
        let page: Vec<Event> = (1..=FOLLOW_PAGE_EVENTS as u64)
            .map(|s| event(s, s))
            .collect();
        let followed = follower.handle_page(&page, 1, 1_000, &waiters);
        assert!(followed.more && followed.look.is_empty());
        let followed = follower.handle_page(&page, 1, FOLLOW_PAGE_EVENTS as u64, &waiters);
        assert!(!followed.more);
    }
}
