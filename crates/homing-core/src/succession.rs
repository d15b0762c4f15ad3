//! Successions (DESIGN.md §7.5): who continues a reservation, as the global
//! store records it, write-once per reservation. Every cross-DC successor
//! decision goes through this one entry, so a move and a takeover can never
//! both succeed the same tail:
//!
//! ```text
//! move:      W asks X to link t → W ── Linked ──► W confirms `succ/t = W` ── Inserted / Exists(W) ──► grant
//!                                                            └ Exists(Y) (a takeover won) ──► W links itself W → Y, never grants
//! takeover:  X did not answer ─► `succ/t`? ── present ──► follow it like a link
//!                                   └ absent ─► X's lease expired (by the store's clock, in the same
//!                                               store transaction as the write) ─► `succ/t = Y` ──► grant
//! return:    X renews its lease, then applies every `succ/` entry of its reservations to its records
//!            before it grants anything
//! ```
//!
//! A taker cannot know the dead DC's last token for `t`; it uses the DC's
//! published token bound (every token the DC granted is at most it): the
//! takeover link's token is `bound + 1` and the taker's first token
//! `bound + 2`, above any token `t`'s DC or a mover that lost could have
//! granted. A move's link carries `t`'s token as the mover read it.

use serde::{Deserialize, Serialize};

use crate::dc_lease::{DcLeaseState, DcStanding};
use crate::fencing::FencingToken;
use crate::link::Link;
use crate::record::DcRecord;
use crate::reservation::ReservationId;

// Their public paths from before `link`.
pub use crate::link::{Succession, SuccessionCause};

// The type is in `link`, so that `record` can name it without importing this
// module, which reads records; its constructors stay here with the token rule
// `taken_over` applies.
impl Succession {
    /// A move: `from`'s DC linked `from` (token `token`) to `to`.
    pub fn moved(from: ReservationId, to: ReservationId, token: FencingToken) -> Succession {
        Succession {
            link: Link { from, to, token },
            cause: SuccessionCause::Moved,
        }
    }

    /// A takeover of `from`, whose DC published `token_bound`, by `to`.
    pub fn taken_over(from: ReservationId, to: ReservationId, token_bound: u64) -> Succession {
        Succession {
            link: Link {
                from,
                to,
                token: takeover_link_token(token_bound),
            },
            cause: SuccessionCause::TakenOver,
        }
    }

    /// Whether the successor is `to`.
    pub fn names(&self, to: &ReservationId) -> bool {
        &self.link.to == to
    }
}

/// The succession a DC must find in the global store before its `record`
/// grants again or links onward, if the record continues a reservation of
/// another DC (`None`: the key's first reservation, or its predecessor is
/// the same DC's). A record whose mover crashed between the link and its
/// confirmation, or lost it to a takeover, must never act as a member of
/// the chain: the global store decides.
pub fn confirmation_of(record: &DcRecord) -> Option<Succession> {
    let from = record.predecessor.clone()?;
    if from.dc() == record.id.dc() {
        return None;
    }
    // Its first token was above the predecessor's last; it only rose.
    let token = FencingToken::new(record.token.get().saturating_sub(1));
    Some(Succession::moved(from, record.id.clone(), token))
}

/// The succession a `record` that lost its confirmation to `winner` writes
/// for itself before it links locally to the winner: so the global store,
/// not only its DC, says who continues it, and no takeover of it can fork
/// the chain later.
pub fn superseding(record: &DcRecord, winner: &ReservationId) -> Succession {
    Succession::moved(record.id.clone(), winner.clone(), record.token)
}

/// Whether a takeover may be written now (the check every store makes in
/// the transaction that writes it): `policy` allows the taken DC in
/// `state`, and the DC has not published a higher token bound since the
/// taker read it (its link token is above the bound the store keeps).
pub fn takeover_allowed(
    policy: TakeoverPolicy,
    state: &DcLeaseState,
    succession: &Succession,
) -> bool {
    policy.allows(state) && succession.link.token.get() > state.marks.token_bound
}

/// What a store answers to a takeover given what it read in the
/// transaction that writes it: the reservation's succession (`existing`)
/// and its DC's lease as judged then. `None`: write it (then `Taken`).
pub fn judge_takeover(
    existing: Option<Succession>,
    state: DcLeaseState,
    policy: TakeoverPolicy,
    succession: &Succession,
) -> Option<TakeOverReply> {
    match existing {
        Some(existing) => Some(TakeOverReply::Exists(existing)),
        None if !takeover_allowed(policy, &state, succession) => {
            Some(TakeOverReply::Refused(state))
        }
        None => None,
    }
}

/// The token a takeover's link carries: above every token the dead DC
/// granted (`token_bound`). The taker's first token is the next one.
pub fn takeover_link_token(token_bound: u64) -> FencingToken {
    FencingToken::new(token_bound.saturating_add(1).max(1))
}

/// What a guarded takeover write found.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum TakeOverReply {
    /// The takeover is the reservation's succession, forever.
    Taken,
    /// The reservation already had a succession (equal to the caller's on a
    /// retry of a write that was applied).
    Exists(Succession),
    /// The reservation's DC may still have a host acting (or, under
    /// [`TakeoverPolicy::RetiredOnly`], is not retired): nothing written.
    Refused(DcLeaseState),
}

/// When a DC may take over another DC's tails (per deployment).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum TakeoverPolicy {
    /// Once the global store judges the tail's DC lease expired.
    Automatic,
    /// Only once an operator retired the tail's DC (`homing dc retire`),
    /// and its lease expired.
    RetiredOnly,
}

impl TakeoverPolicy {
    /// Whether a DC in `state` may be taken over: always only once expired
    /// (no host of it can still act), and retired under `RetiredOnly`.
    pub fn allows(&self, state: &DcLeaseState) -> bool {
        state.standing == DcStanding::Expired
            && match self {
                TakeoverPolicy::Automatic => true,
                TakeoverPolicy::RetiredOnly => state.retired,
            }
    }

    /// The policy's name in configuration and logs.
    pub fn as_str(&self) -> &'static str {
        match self {
            TakeoverPolicy::Automatic => "automatic",
            TakeoverPolicy::RetiredOnly => "retired-only",
        }
    }
}

impl std::str::FromStr for TakeoverPolicy {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "automatic" => Ok(TakeoverPolicy::Automatic),
            "retired-only" => Ok(TakeoverPolicy::RetiredOnly),
            other => Err(format!(
                "unknown takeover policy {other:?}: expected \"automatic\" or \"retired-only\""
            )),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::dc::DcId;
    use crate::dc_lease::{DcMarks, DcTerms};

    fn state(standing: DcStanding, retired: bool) -> DcLeaseState {
        DcLeaseState {
            dc: DcId::new("iad").unwrap(),
            standing,
            terms: Some(DcTerms {
                ttl_ms: 1_000,
                host_lease_ttl_max_ms: 1_000,
                grace_ms: 1_000,
            }),
            marks: DcMarks::default(),
            retired,
        }
    }

    #[test]
    fn only_an_expired_dc_is_taken_over_and_retired_only_needs_retirement() {
        let live = state(DcStanding::Live { remaining_ms: 5 }, true);
        let lapsed = state(DcStanding::Lapsed { expires_in_ms: 5 }, true);
        let unknown = state(DcStanding::Unknown, true);
        for s in [&live, &lapsed, &unknown] {
            assert!(!TakeoverPolicy::Automatic.allows(s));
            assert!(!TakeoverPolicy::RetiredOnly.allows(s));
        }
        assert!(TakeoverPolicy::Automatic.allows(&state(DcStanding::Expired, false)));
        assert!(!TakeoverPolicy::RetiredOnly.allows(&state(DcStanding::Expired, false)));
        assert!(TakeoverPolicy::RetiredOnly.allows(&state(DcStanding::Expired, true)));
    }

    #[test]
    fn a_takeover_link_is_above_every_token_the_dead_dc_granted() {
        let s = Succession::taken_over("iad.4".parse().unwrap(), "fra.9".parse().unwrap(), 41);
        assert_eq!(s.link.token.get(), 42);
        assert_eq!(s.cause, SuccessionCause::TakenOver);
        assert_eq!(takeover_link_token(u64::MAX).get(), u64::MAX);
        assert!(s.names(&"fra.9".parse().unwrap()));
    }

    #[test]
    fn policy_names_round_trip_and_a_bad_one_says_what_is_expected() {
        for p in [TakeoverPolicy::Automatic, TakeoverPolicy::RetiredOnly] {
            assert_eq!(p.as_str().parse::<TakeoverPolicy>(), Ok(p));
        }
        let e = "auto".parse::<TakeoverPolicy>().unwrap_err();
        assert!(e.contains("retired-only"), "{e}");
    }
}
