//! A cancel a host owes its DC (DESIGN.md §7.3). A host that gave up on an
//! acquire (no reply to any try) tells its DC `Cancel { key, lease }`, so a
//! grant it never saw does not hold the key until ttl + grace with no actor
//! behind it. The acquire went unanswered because the DC could not be
//! reached, so the first cancel is often lost the same way: the host sends
//! it again, backing off, until the DC answers it, for as long as the DC
//! remembers cancellations ([`CANCEL_OWED_MS`]; past that any grant made for
//! the acquire has been answered and expires on its own). HostAgent and the
//! simulator's hosts both keep their owed cancels here.

use crate::host_lease::HostInstant;
use crate::key::Key;
use crate::lease_key::LeaseKey;
use crate::wire::{ErrorKind, Reply, Request, WAIT_MS_MAX};

/// Wait before the first resend, ms; it doubles after each unanswered one.
pub const CANCEL_RETRY_MS_MIN: u64 = 250;
/// Longest wait between resends, ms.
pub const CANCEL_RETRY_MS_MAX: u64 = 5_000;
/// How long a host owes a cancel, ms: as long as a DC remembers one (an
/// acquire's longest wait plus a minute for its walks and writes).
pub const CANCEL_OWED_MS: u64 = WAIT_MS_MAX as u64 + 60_000;

/// One cancel owed to the host's DC.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OwedCancel {
    key: Key,
    lease: LeaseKey,
    /// Past this, it is owed no more.
    until: HostInstant,
    /// The wait before the next resend.
    retry_ms: u64,
    /// Sends so far.
    sent: u32,
}

/// What an answer to an owed cancel means.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CancelAnswer {
    /// The DC answered it: a grant, if one was made, is released.
    Done,
    /// The DC could not act on it now (unavailable, overloaded): send it again.
    Again,
}

impl OwedCancel {
    /// The cancel of the acquire of `key` sent with `lease`, owed from `now`.
    pub fn new(key: Key, lease: LeaseKey, now: HostInstant) -> OwedCancel {
        OwedCancel {
            key,
            lease,
            until: now.plus_us(CANCEL_OWED_MS * 1_000),
            retry_ms: CANCEL_RETRY_MS_MIN,
            sent: 0,
        }
    }

    /// The request to send (each send counts).
    pub fn send(&mut self) -> Request {
        self.sent += 1;
        Request::Cancel {
            key: self.key.clone(),
            lease: self.lease,
        }
    }

    /// The key the abandoned acquire asked for.
    pub fn key(&self) -> &Key {
        &self.key
    }

    /// How many times it was sent.
    pub fn sent(&self) -> u32 {
        self.sent
    }

    /// What `reply` to the cancel means. An error the DC could get past
    /// later is worth another send; any other error will not change.
    pub fn answered(reply: &Reply) -> CancelAnswer {
        match reply {
            Reply::Error(e)
                if matches!(
                    e.kind,
                    ErrorKind::Unavailable { .. } | ErrorKind::Overloaded | ErrorKind::Internal
                ) =>
            {
                CancelAnswer::Again
            }
            _ => CancelAnswer::Done,
        }
    }

    /// The last send got no answer (or [`CancelAnswer::Again`]) at `now`:
    /// when to send it again, or `None` when it is owed no more.
    pub fn unanswered(&mut self, now: HostInstant) -> Option<HostInstant> {
        let at = now.plus_us(self.retry_ms * 1_000);
        if at > self.until {
            return None;
        }
        self.retry_ms = (self.retry_ms * 2).min(CANCEL_RETRY_MS_MAX);
        Some(at)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::key::{KeyName, Namespace};
    use crate::wire::ErrorReply;

    fn owed(now: HostInstant) -> OwedCancel {
        let key = Key::in_namespace(Namespace::default(), KeyName::new("room-7").unwrap());
        OwedCancel::new(key, LeaseKey::from_bytes([7; 16]).unwrap(), now)
    }

    #[test]
    fn resends_back_off_to_their_cap_and_stop_when_owed_no_more() {
        let start = HostInstant::from_us(1_000_000);
        let mut cancel = owed(start);
        assert!(matches!(cancel.send(), Request::Cancel { .. }));
        let mut now = start;
        let mut waits = Vec::new();
        while let Some(at) = cancel.unanswered(now) {
            waits.push(at.us_since(now) / 1_000);
            now = at;
            cancel.send();
        }
        assert_eq!(&waits[..6], &[250, 500, 1_000, 2_000, 4_000, 5_000]);
        assert!(waits[6..].iter().all(|w| *w == CANCEL_RETRY_MS_MAX));
        // Never past the DC's memory of cancellations.
        assert!(now.us_since(start) <= CANCEL_OWED_MS * 1_000);
        assert!(now.us_since(start) + CANCEL_RETRY_MS_MAX * 1_000 > CANCEL_OWED_MS * 1_000);
        assert_eq!(cancel.sent() as usize, waits.len() + 1);
    }

    #[test]
    fn an_answer_ends_it_unless_the_dc_could_not_act_yet() {
        assert_eq!(
            OwedCancel::answered(&Reply::Cancelled(false)),
            CancelAnswer::Done
        );
        let busy = Reply::Error(ErrorReply::new(ErrorKind::Overloaded, "busy"));
        assert_eq!(OwedCancel::answered(&busy), CancelAnswer::Again);
        let bad = Reply::Error(ErrorReply::new(ErrorKind::BadRequest, "no"));
        assert_eq!(OwedCancel::answered(&bad), CancelAnswer::Done);
    }
}
