//! A DC back from a lapsed lease applies the takeovers made meanwhile
//! (DESIGN.md §7.5): every succession the global store records of this
//! DC's reservations is read page by page, and each takeover is applied
//! to its record as a [`Change::Supersede`] update (the tail is linked to
//! the winner). Until a reconciliation succeeds the DC grants and renews
//! nothing ([`crate::DcLease::reconciliation`]); the driver hands the
//! number back with [`crate::DcLease::handle_reconciled`] when this one is
//! `Done(Ok(_))`, and runs a new one after a failure. Decided here once
//! for homingd and the simulator.
//!
//! ```text
//! page ─► each takeover of the page ─► Supersede update ─► next page … ─► Done(Ok(changed))
//!   a record this DC has no record of ─► Unknown event, skipped
//!   any other failure, or a page naming another DC's reservation
//!   ─► Done(Err): nothing granted until a new pass succeeds
//! ```
//!
//! A failed pass leaves a [`Resumption`]: the next pass of the same
//! reconciliation starts after the last succession it settled, so a store
//! failing now and then still lets a DC with many takeovers finish (each
//! pass gets further). A pass of a newer reconciliation (the lease lapsed
//! again: new takeovers may sit anywhere) starts from the first page.

use std::collections::VecDeque;

use homing_core::{
    DcId, ErrorKind, ErrorReply, LeasePolicy, ReservationId, StoreTime, Succession, SuccessionCause,
};

use crate::request::change::Change;
use crate::request::update::{Update, UpdateError};
use crate::step::effect::{GlobalAnswer, GlobalOp, Stored, unasked};
use crate::step::event::{NodeEvent, ReconcileEvent};
use crate::step::failure::Failure;
use crate::step::time::NodeTime;
use crate::step::{Answer, Effect, Now, Step, Stepper};
use homing_core::mutation::Mutations;

/// Successions asked for a page: the most any global store returns at once
/// (homing-store's `GET_MANY_KEYS_MAX`; homingd checks the two agree).
pub const PAGE_SUCCESSIONS: usize = 128;

/// Where a failed pass got to: every succession of its DC up to `after`
/// was settled (applied, already applied, unknown, or a move). Kept by the
/// driver between passes, in memory (a restart starts over, which is only
/// slower).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Resumption {
    number: u64,
    after: ReservationId,
}

#[derive(Debug)]
enum Phase {
    /// Read the page after the cursor.
    Page,
    /// Apply the page's takeovers, one update at a time: this one's.
    Apply(Box<Update>, Succession),
    Done(Result<usize, Failure>),
}

/// One reconciliation pass in progress.
#[derive(Debug)]
pub struct Reconcile {
    dc: DcId,
    number: u64,
    policy: LeasePolicy,
    mutations: Mutations,
    /// The last succession read (the next page starts after it).
    after: Option<ReservationId>,
    /// The last succession settled: a later pass may start after it.
    settled: Option<ReservationId>,
    /// Where this pass started, if it resumes a failed one.
    resumed: Option<ReservationId>,
    /// Whether the page read was the last.
    last_page: bool,
    /// The page's takeovers not applied yet.
    takeovers: VecDeque<Succession>,
    changed: usize,
    events: VecDeque<ReconcileEvent>,
    phase: Phase,
}

impl Reconcile {
    /// DC `dc`'s reconciliation `number` (what [`crate::DcLease::reconciliation`]
    /// owes), under the DC's lease `policy`.
    pub fn new(dc: DcId, number: u64, policy: LeasePolicy, mutations: Mutations) -> Reconcile {
        Reconcile {
            dc,
            number,
            policy,
            mutations,
            after: None,
            settled: None,
            resumed: None,
            last_page: false,
            takeovers: VecDeque::new(),
            changed: 0,
            events: VecDeque::new(),
            phase: Phase::Page,
        }
    }

    /// This pass starts after where a failed pass of the same
    /// reconciliation got to, if `previous` is one (one of another number
    /// is ignored: its takeovers are not all the ones owed now).
    pub fn resuming(mut self, previous: Option<&Resumption>) -> Reconcile {
        if let Some(previous) = previous.filter(|p| p.number == self.number) {
            self.after = Some(previous.after.clone());
            self.settled = Some(previous.after.clone());
            self.resumed = Some(previous.after.clone());
        }
        self
    }

    /// Where this pass started, if it resumes a failed one ([`Reconcile::resuming`]).
    pub fn resumes_after(&self) -> Option<&ReservationId> {
        self.resumed.as_ref()
    }

    /// Where a later pass of this reconciliation may start (after a
    /// failure: `Done(Err)`), if this one settled anything.
    pub fn resumption(&self) -> Option<Resumption> {
        let after = self.settled.clone()?;
        Some(Resumption {
            number: self.number,
            after,
        })
    }

    /// The reconciliation's number, for [`crate::DcLease::handle_reconciled`].
    pub fn number(&self) -> u64 {
        self.number
    }

    /// What to do next.
    fn next(&mut self) -> Step<<Reconcile as Stepper>::Output> {
        loop {
            let next = match &mut self.phase {
                Phase::Page => {
                    return Step::Ask(Effect::Global(GlobalOp::SuccessionsOf {
                        dc: self.dc.clone(),
                        after: self.after.clone(),
                        limit: PAGE_SUCCESSIONS,
                    }));
                }
                Phase::Apply(update, takeover) => match update.next() {
                    Step::Ask(effect) => return Step::Ask(effect),
                    Step::Done(Ok(changed)) => {
                        if changed.made() {
                            self.changed += 1;
                            let applied = ReconcileEvent::Superseded(takeover.clone());
                            self.events.push_back(applied);
                        }
                        self.settled = Some(takeover.link.from.clone());
                        self.next_takeover()
                    }
                    Step::Done(Err(UpdateError::Unknown { id, .. })) => {
                        self.settled = Some(id.clone());
                        self.events.push_back(ReconcileEvent::Unknown(id));
                        self.next_takeover()
                    }
                    Step::Done(Err(e)) => {
                        let mut reply = e.reply();
                        let from = &takeover.link.from;
                        reply.message =
                            format!("applying the takeover of {from}: {}", reply.message);
                        Phase::Done(Err(Failure::from_reply(reply)))
                    }
                },
                Phase::Done(done) => return Step::Done(done.clone()),
            };
            self.phase = next;
        }
    }

    /// The answer to the [`Effect::Global`] asked (its failure ends
    /// the pass).
    pub fn handle_global(&mut self, answer: Result<GlobalAnswer, Failure>) {
        if !matches!(self.phase, Phase::Page) {
            unasked("reconcile", &answer);
        }
        let page = match answer {
            Ok(GlobalAnswer::Successions(page)) => page,
            Ok(other) => unasked("reconcile", &other),
            Err(failure) => {
                self.phase = Phase::Done(Err(failure));
                return;
            }
        };
        if let Some(foreign) = page.iter().find(|s| s.link.from.dc() != &self.dc) {
            let message = format!(
                "the global store answered dc {}'s successions with {}'s",
                self.dc, foreign.link.from
            );
            let lie = ErrorReply::new(ErrorKind::Inconsistent, message);
            self.phase = Phase::Done(Err(Failure::Lied(lie)));
            return;
        }
        // Fewer than asked only at the end.
        self.last_page = page.len() < PAGE_SUCCESSIONS;
        self.after = page
            .last()
            .map(|s| s.link.from.clone())
            .or(self.after.take());
        let taken = page
            .into_iter()
            .filter(|s| s.cause == SuccessionCause::TakenOver);
        self.takeovers.extend(taken);
        self.phase = self.next_takeover();
    }

    /// The answer to the [`Effect::Store`] asked at `now` (store
    /// clock; its failure ends the pass).
    pub fn handle_stored(&mut self, stored: Result<Stored, Failure>, now: StoreTime) {
        let Phase::Apply(update, _) = &mut self.phase else {
            unasked("reconcile", &stored);
        };
        match stored {
            Ok(stored) => update.handle_stored(stored, now),
            Err(failure) => self.phase = Phase::Done(Err(failure)),
        }
    }

    /// The next takeover's update, the next page, or done.
    fn next_takeover(&mut self) -> Phase {
        match self.takeovers.pop_front() {
            Some(succession) => {
                let (dc, from) = (self.dc.clone(), succession.link.from.clone());
                let change = Change::Supersede(succession.clone());
                let update = Update::new(dc, from, change, self.policy, self.mutations);
                Phase::Apply(Box::new(update), succession)
            }
            None => {
                // The page's moves after its last takeover are settled too.
                self.settled = self.after.clone();
                if self.last_page {
                    Phase::Done(Ok(self.changed))
                } else {
                    Phase::Page
                }
            }
        }
    }
}

impl Stepper for Reconcile {
    type Output = Result<usize, Failure>;

    fn step(&mut self, _now: NodeTime) -> Step<Self::Output> {
        self.next()
    }

    fn answer(&mut self, answer: Answer, now: Now) {
        match answer {
            Answer::Global(global) => self.handle_global(global),
            Answer::Stored(stored) => self.handle_stored(stored, now.store),
            other => unasked("reconcile", &other),
        }
    }

    fn poll_event(&mut self) -> Option<NodeEvent> {
        self.events.pop_front().map(NodeEvent::Reconciled)
    }
}

#[cfg(test)]
mod tests {
    use homing_core::{ErrorKind, RecordState, Written};

    use super::*;
    use crate::fixture::{POLICY, held};
    use crate::step::effect::StoreOp;

    fn id(s: &str) -> ReservationId {
        s.parse().unwrap()
    }

    fn reconcile() -> Reconcile {
        Reconcile::new("iad".parse().unwrap(), 3, POLICY, Mutations::NONE)
    }

    /// Moves of iad.0 … iad.(n-1) to fra.1 (confirmed by their movers:
    /// nothing to apply).
    fn moves(n: u64) -> Vec<Succession> {
        let token = homing_core::FencingToken::FIRST;
        (0..n)
            .map(|u| {
                let from = ReservationId::new("iad".parse().unwrap(), u);
                Succession::moved(from, id("fra.1"), token)
            })
            .collect()
    }

    /// Answers the page asked next (after `after`) with `page`.
    fn page(reconcile: &mut Reconcile, after: Option<&str>, page: Vec<Succession>) {
        let Step::Ask(Effect::Global(GlobalOp::SuccessionsOf {
            dc, after: asked, ..
        })) = reconcile.step(NodeTime::from_us(0))
        else {
            panic!("a page is read")
        };
        assert_eq!(dc.as_str(), "iad");
        assert_eq!(asked, after.map(id));
        reconcile.handle_global(Ok(GlobalAnswer::Successions(page)));
    }

    /// Answers the read and the compare-and-set of the supersede asked next; the record written.
    fn superseded(
        reconcile: &mut Reconcile,
        record: &homing_core::DcRecord,
    ) -> homing_core::DcRecord {
        let now = StoreTime::from_ms(1);
        assert_eq!(
            reconcile.step(NodeTime::from_us(0)),
            Step::Ask(Effect::Store(StoreOp::Read(record.id.clone())))
        );
        let read = Ok(Stored::Record(Some(homing_core::RecordRead::alone(
            record.clone(),
        ))));
        reconcile.handle_stored(read, now);
        let Step::Ask(Effect::Store(StoreOp::Write {
            record: written, ..
        })) = reconcile.step(NodeTime::from_us(0))
        else {
            panic!("the record is superseded")
        };
        reconcile.handle_stored(Ok(Stored::Written(Written::Yes)), now);
        *written
    }

    #[test]
    fn every_takeover_of_every_page_is_applied_and_moves_are_left_alone() {
        let (one, two) = (
            held("iad.200", "a", None, StoreTime::from_ms(0)),
            held("iad.207", "b", None, StoreTime::from_ms(0)),
        );
        let mut reconcile = reconcile();
        // A full page: moves (confirmed by their movers, nothing to apply)
        // and, last, a takeover.
        let mut first = moves(PAGE_SUCCESSIONS as u64 - 1);
        let taken = Succession::taken_over(id("iad.200"), id("lhr.2"), 1);
        first.push(taken.clone());
        page(&mut reconcile, None, first);
        let written = superseded(&mut reconcile, &one);
        assert!(
            matches!(&written.state, RecordState::Linked { to, .. } if to == &id("lhr.2")),
            "{written:?}"
        );
        // Full: another page is read, after the last one read.
        let later = Succession::taken_over(id("iad.207"), id("sin.3"), 1);
        page(&mut reconcile, Some("iad.200"), vec![later.clone()]);
        superseded(&mut reconcile, &two);
        assert_eq!(reconcile.step(NodeTime::from_us(0)), Step::Done(Ok(2)));
        assert_eq!(
            reconcile.poll_event(),
            Some(NodeEvent::Reconciled(ReconcileEvent::Superseded(taken)))
        );
        assert_eq!(
            reconcile.poll_event(),
            Some(NodeEvent::Reconciled(ReconcileEvent::Superseded(later)))
        );
        assert_eq!(reconcile.poll_event(), None);
    }

    #[test]
    fn a_takeover_of_a_reservation_without_a_record_is_skipped_and_a_store_failure_ends_the_pass() {
        let mut reconcile = reconcile();
        let lost = Succession::taken_over(id("iad.1"), id("lhr.2"), 1);
        let next = Succession::taken_over(id("iad.4"), id("lhr.5"), 1);
        page(&mut reconcile, None, vec![lost, next]);
        let now = StoreTime::from_ms(1);
        assert_eq!(
            reconcile.step(NodeTime::from_us(0)),
            Step::Ask(Effect::Store(StoreOp::Read(id("iad.1"))))
        );
        reconcile.handle_stored(Ok(Stored::Record(None)), now);
        // Skipped: the next one is read.
        assert_eq!(
            reconcile.step(NodeTime::from_us(0)),
            Step::Ask(Effect::Store(StoreOp::Read(id("iad.4"))))
        );
        assert_eq!(
            reconcile.poll_event(),
            Some(NodeEvent::Reconciled(ReconcileEvent::Unknown(id("iad.1"))))
        );
        // The store fails: the pass fails, the DC still owes it.
        let down = Failure::of_store(&"iad".parse().unwrap(), true, "store down");
        reconcile.handle_stored(Err(down), now);
        let Step::Done(Err(failure)) = reconcile.step(NodeTime::from_us(0)) else {
            panic!("failed")
        };
        assert!(failure.is_unreachable());
        assert!(matches!(
            failure.into_reply().kind,
            ErrorKind::Unavailable { .. }
        ));
    }

    #[test]
    fn a_failed_pass_is_resumed_after_the_last_takeover_it_settled_by_the_same_reconciliation_only()
    {
        let (one, two) = (
            held("iad.1", "a", None, StoreTime::from_ms(0)),
            held("iad.4", "b", None, StoreTime::from_ms(0)),
        );
        let takeovers = [
            Succession::taken_over(id("iad.1"), id("lhr.2"), 1),
            Succession::taken_over(id("iad.4"), id("lhr.5"), 1),
        ];
        let mut first = reconcile();
        page(&mut first, None, takeovers.to_vec());
        assert_eq!(first.resumption(), None, "nothing settled yet");
        superseded(&mut first, &one);
        // The second takeover's read fails: the pass fails.
        assert!(matches!(
            first.step(NodeTime::from_us(0)),
            Step::Ask(Effect::Store(_))
        ));
        let down = Failure::of_store(&"iad".parse().unwrap(), true, "store down");
        first.handle_stored(Err(down), StoreTime::from_ms(1));
        assert!(matches!(
            first.step(NodeTime::from_us(0)),
            Step::Done(Err(_))
        ));
        let resumption = first.resumption().expect("one takeover settled");
        // The next pass of the same reconciliation starts after iad.1 and
        // applies the one left.
        let mut again = reconcile().resuming(Some(&resumption));
        assert_eq!(again.resumes_after(), Some(&id("iad.1")));
        page(&mut again, Some("iad.1"), vec![takeovers[1].clone()]);
        superseded(&mut again, &two);
        assert_eq!(again.step(NodeTime::from_us(0)), Step::Done(Ok(1)));
        // A newer reconciliation (the lease lapsed again) starts over.
        let newer = Reconcile::new("iad".parse().unwrap(), 4, POLICY, Mutations::NONE);
        let mut newer = newer.resuming(Some(&resumption));
        assert_eq!(newer.resumes_after(), None);
        page(&mut newer, None, Vec::new());
        assert_eq!(newer.step(NodeTime::from_us(0)), Step::Done(Ok(0)));
    }

    #[test]
    fn a_pass_failing_after_a_page_of_moves_resumes_after_the_page() {
        let mut first = reconcile();
        page(&mut first, None, moves(PAGE_SUCCESSIONS as u64));
        // The next page's read fails.
        assert!(matches!(
            first.step(NodeTime::from_us(0)),
            Step::Ask(Effect::Global(_))
        ));
        let down = Failure::of_store(&"iad".parse().unwrap(), true, "global store down");
        first.handle_global(Err(down));
        assert!(matches!(
            first.step(NodeTime::from_us(0)),
            Step::Done(Err(_))
        ));
        let resumption = first.resumption().expect("a page settled");
        let mut again = reconcile().resuming(Some(&resumption));
        page(&mut again, Some("iad.127"), Vec::new());
        assert_eq!(again.step(NodeTime::from_us(0)), Step::Done(Ok(0)));
    }

    #[test]
    fn no_succession_is_done_after_one_read_and_a_failed_read_fails_the_pass() {
        let mut quiet = reconcile();
        page(&mut quiet, None, Vec::new());
        assert_eq!(quiet.step(NodeTime::from_us(0)), Step::Done(Ok(0)));
        let mut cut_off = reconcile();
        assert!(matches!(
            cut_off.step(NodeTime::from_us(0)),
            Step::Ask(Effect::Global(_))
        ));
        let down = Failure::of_store(&"iad".parse().unwrap(), true, "global store down");
        cut_off.handle_global(Err(down.clone()));
        assert_eq!(cut_off.step(NodeTime::from_us(0)), Step::Done(Err(down)));
    }

    #[test]
    fn a_page_naming_another_dcs_reservation_fails_the_pass_as_a_lie() {
        let mut reconcile = reconcile();
        let foreign = Succession::taken_over(id("fra.1"), id("lhr.2"), 1);
        page(&mut reconcile, None, vec![foreign]);
        let Step::Done(Err(Failure::Lied(e))) = reconcile.step(NodeTime::from_us(0)) else {
            panic!("a lie ends the pass")
        };
        assert_eq!(e.kind, ErrorKind::Inconsistent);
    }
}
