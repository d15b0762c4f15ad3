//! How the CLI prints what homing answers.

use homing_client::Resolution;
use homing_core::{DcRecord, RecordState, Reply, Walked};

/// One line for a resolution.
pub fn resolution(r: &Resolution) -> String {
    let origin = if r.stale {
        "stale, remembered"
    } else if r.from_cache {
        "cache"
    } else {
        "walked"
    };
    format!(
        "{} → dc {} reservation {} actor {} token {} ({} hop(s), {} round trip(s), {origin})",
        r.key, r.dc, r.reservation, r.actor, r.token, r.hops, r.remote_round_trips
    )
}

/// A resolution as one JSON object (`homing resolve --json`).
pub fn resolution_json(r: &Resolution) -> serde_json::Value {
    serde_json::json!({
        "outcome": "ok",
        "namespace": r.key.namespace.as_str(),
        "key": r.key.name.as_str(),
        "dc": r.dc.as_str(),
        "reservation": r.reservation.to_string(),
        "actor": r.actor.as_str(),
        "token": r.token.get(),
        "hops": r.hops,
        "round_trips": r.remote_round_trips,
        "from_cache": r.from_cache,
        "stale": r.stale,
    })
}

/// What kind of answer a reply is, in words (for a reply that does not fit
/// the request: never Debug output).
pub fn reply_kind(reply: &Reply) -> String {
    match reply {
        Reply::Resolved { .. } => "a resolve answer".into(),
        Reply::Reservation(_) => "a reservation's state".into(),
        Reply::Acquire(_) => "an acquire answer".into(),
        Reply::Renew(_) => "a renewal answer".into(),
        Reply::Release(_) => "a release answer".into(),
        Reply::Link(_) => "a link answer".into(),
        Reply::Noted(_) => "a shortcut answer".into(),
        Reply::Cancelled(_) => "a cancel answer".into(),
        Reply::Drained => "\"drained\"".into(),
        Reply::Inspected { .. } => "an inspection".into(),
        Reply::Awaited(_) => "an await answer".into(),
        Reply::Events { .. } => "a page of events".into(),
        Reply::Records { .. } => "a page of records".into(),
        Reply::DrainedPage { .. } => "a page of drained leases".into(),
        Reply::Error(e) => format!("an error: {e}"),
        Reply::Successor { .. } => "a succession".into(),
        Reply::Directory(_) => "a dc directory".into(),
        Reply::DcReport(_) => "a dc report".into(),
        Reply::SessionOpened { .. } => "a host session opened".into(),
        Reply::SessionRenewed(_) => "a host session's renewal answer".into(),
        Reply::SessionClosed(_) => "a host session's close answer".into(),
        Reply::SessionKeys { .. } => "a page of a host session's keys".into(),
    }
}

/// The chain hop by hop, one line each, indented by `indent`
/// ([`Walked::hops`]: the status page shows the same lines).
pub fn chain(walked: &Walked, indent: &str) -> String {
    let lines: Vec<String> = walked
        .hops()
        .into_iter()
        .map(|line| format!("{indent}{line}"))
        .collect();
    lines.join("\n")
}

/// One line for a DC record: key, reservation, token, state.
pub fn record(r: &DcRecord) -> String {
    let state = match &r.state {
        RecordState::Active {
            actor,
            expiry: homing_core::Expiry::Frozen { session, .. },
            ..
        } => format!("active (frozen in session {session}), actor {actor}"),
        RecordState::Active {
            actor,
            expiry: homing_core::Expiry::Session(session),
            ..
        } if r.allow_renew => format!("active in session {session}, actor {actor}"),
        RecordState::Active { actor, .. } if r.allow_renew => format!("active, actor {actor}"),
        RecordState::Active { actor, .. } => format!("active (drained), actor {actor}"),
        RecordState::Released { cause, .. } => format!("vacant, last run {cause}"),
        RecordState::Linked { to } => format!("linked → {to}"),
        RecordState::Abandoned => "abandoned".to_string(),
    };
    format!(
        "{:<24} {:<10} token {:<3} {state}",
        r.key.to_string(),
        r.id.to_string(),
        r.token.get()
    )
}
