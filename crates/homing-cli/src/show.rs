//! How the CLI prints what homing answers.

use homing_client::Resolution;
use homing_core::{DcRecord, RecordState, Reply, Source, TailState, Walked};

fn source(source: Source) -> &'static str {
    match source {
        Source::Cache => "cache",
        Source::Local => "same reply",
        Source::Remote => "round trip",
    }
}

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
    }
}

/// The chain hop by hop, one line each, indented by `indent`: the links
/// followed, and each shortcut tried where the walk stood when it tried it
/// (the links a taken shortcut skips are not walked, so not shown: `homing
/// inspect` shows every record).
pub fn chain(walked: &Walked, indent: &str) -> String {
    let mut lines = vec![format!("{indent}global entry → {}", walked.entry)];
    let jumps_from = |at: &homing_core::ReservationId, lines: &mut Vec<String>| {
        for jump in walked.jumps.iter().filter(|j| &j.from == at) {
            lines.push(match jump.taken {
                true => format!(
                    "{indent}{} shortcut → {} (dc {}), skipping the links between",
                    jump.from,
                    jump.to,
                    jump.to.dc()
                ),
                false => format!(
                    "{indent}{} shortcut → {} did not hold up; following the links",
                    jump.from, jump.to
                ),
            });
        }
    };
    jumps_from(&walked.entry, &mut lines);
    for (link, from) in walked.links.iter().zip(&walked.link_sources) {
        lines.push(format!(
            "{indent}{} (dc {}) released, linked → {}   [{}]",
            link.from,
            link.from.dc(),
            link.to,
            source(*from)
        ));
        jumps_from(&link.to, &mut lines);
    }
    let tail = &walked.tail;
    let state = match &tail.state {
        TailState::Active { actor } => format!("active, actor {actor}"),
        TailState::Vacant { ended } => format!("vacant, last run {ended}"),
    };
    lines.push(format!(
        "{indent}{} (dc {}) tail: {state}, token {}   [{}]",
        tail.id,
        tail.id.dc(),
        tail.token,
        source(walked.tail_source)
    ));
    lines.push(format!(
        "{indent}{} remote round trip(s)",
        walked.remote_round_trips
    ));
    lines.join("\n")
}

/// One line for a DC record: key, reservation, token, state.
pub fn record(r: &DcRecord) -> String {
    let state = match &r.state {
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
