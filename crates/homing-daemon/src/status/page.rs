//! The status page's HTML, written with maud (checked at compile time,
//! every value escaped): [`full`] is the whole page, [`deployment`] the
//! part its script fetches again every [`REFRESH_MS`].
//!
//! Each DC's row carries `data-dc` and `data-state` (`here`, `unready`,
//! `available`, `unavailable`) so a test, or a person's eyes, find a DC's
//! state without reading prose.

use std::time::Duration;

use homing_core::{DcId, DcLeaseState, DcRecord, DcStanding, Probe, RecordState, SessionCounts};
use maud::{DOCTYPE, Markup, PreEscaped, html};

use super::{DcRow, EVENTS_SHOWN_MAX, Reach, Search, Snapshot};

/// How often the page fetches the deployment part again, in milliseconds.
pub const REFRESH_MS: u64 = 1_000;

/// Where the page's script fetches the deployment part.
pub const DEPLOYMENT_PATH: &str = "/status/deployment";

const STYLE: &str = r#"
body { font: 14px/1.4 system-ui, sans-serif; margin: 1.5em; color: #222; }
h1 { font-size: 1.4em; margin: 0 0 .2em; } h2 { font-size: 1.1em; margin: 1.4em 0 .4em; }
table { border-collapse: collapse; } th, td { padding: .25em .7em; text-align: left; vertical-align: top; }
thead th { border-bottom: 2px solid #ccc; } td, tbody th, #here th { border-bottom: 1px solid #eee; }
code, .mono { font-family: ui-monospace, monospace; font-size: .95em; }
.state { font-weight: 600; padding: .1em .5em; border-radius: .3em; white-space: nowrap; }
.available, .here { background: #dcf5dc; color: #135e13; }
.unavailable, .unready, .failed { background: #fbdcdc; color: #8a1010; }
.lapsed { color: #8a5a00; } .expired, .retired { color: #8a1010; }
.muted { color: #777; } .stale { background: #fff3cd; padding: .3em .6em; }
form input { font: inherit; padding: .2em .4em; } ol.chain { font-family: ui-monospace, monospace; }
"#;

/// Fetches the deployment part every [`REFRESH_MS`] and swaps it in; says
/// so when this homingd stops answering, and keeps the last view.
const SCRIPT: &str = r#"
(function () {
  const box = document.getElementById('deployment');
  const note = document.getElementById('freshness');
  async function refresh() {
    try {
      const answer = await fetch(box.dataset.src, { cache: 'no-store' });
      if (!answer.ok) throw new Error('HTTP ' + answer.status);
      box.innerHTML = await answer.text();
      note.textContent = '';
      note.className = '';
    } catch (e) {
      note.textContent = 'This homingd does not answer (' + e.message + '): the view below is stale.';
      note.className = 'stale';
    }
    setTimeout(refresh, Number(box.dataset.refreshMs));
  }
  setTimeout(refresh, Number(box.dataset.refreshMs));
})();
"#;

/// The whole page: the search, its chain if one was asked for, the
/// deployment part, and the script that keeps it live.
pub fn full(snapshot: &Snapshot, search: Option<&Search>) -> Markup {
    html! {
        (DOCTYPE)
        html lang="en" {
            head {
                meta charset="utf-8";
                meta name="viewport" content="width=device-width, initial-scale=1";
                title { "homing: status from " (snapshot.here) }
                style { (PreEscaped(STYLE)) }
            }
            body {
                h1 { "homing deployment" }
                p.muted { "As seen from DC " strong { (snapshot.here) } "; read-only; refreshed every second." }
                (search_form(search))
                @if let Some(search) = search { (chain(search)) }
                p #freshness {}
                div #deployment data-src=(DEPLOYMENT_PATH) data-refresh-ms=(REFRESH_MS) data-loaded-seq=(snapshot.seq) {
                    (deployment(snapshot))
                }
                script { (PreEscaped(SCRIPT)) }
            }
        }
    }
}

fn search_form(search: Option<&Search>) -> Markup {
    let (namespace, name) = search.map_or(("", ""), |s| (&s.namespace, &s.name));
    html! {
        form method="get" action="/" {
            label { "Key " input name="key" value=(name) placeholder="user-42" required; }
            " "
            label { "namespace " input name="namespace" value=(namespace) placeholder="(default)"; }
            " "
            button type="submit" { "Show its chain" }
        }
    }
}

fn chain(search: &Search) -> Markup {
    html! {
        section #chain {
            h2 { "Chain of " code { (search.name) } @if !search.namespace.is_empty() { " in namespace " code { (search.namespace) } } }
            @match &search.chain {
                Ok(hops) => ol.chain { @for hop in hops { li.hop { (hop) } } },
                Err(e) => p.failed #chain-error { (e) },
            }
        }
    }
}

/// The part that refreshes: every DC, then what this DC alone knows.
pub fn deployment(s: &Snapshot) -> Markup {
    html! {
        p.muted data-seq=(s.seq) { "Read " (httpdate::fmt_http_date(s.at)) " (view " (s.seq) " of this homingd)." }
        @if let Err(e) = &s.global_read { p.failed { "The global store could not be read: " (e) } }
        h2 { "Datacenters" }
        table #dcs {
            thead { tr { th { "DC" } th { "state" } th { "DC lease" } th { "homingd" } th { "round trip from " (s.here) } th { "live leases" } th { "DC store" } } }
            tbody { @for row in &s.dcs { (dc_row(row, s)) } }
        }
        (round_trips(s))
        h2 { "This DC (" (s.here) ")" }
        table #here {
            tr { th { "global store" } td { (health(&s.global_store)) } }
            tr { th { "DC store" } td { (health(&s.dc_store)) } }
            tr { th { "connections" } td {
                @if s.connections.is_empty() { span.muted { "none" } }
                @for (role, n) in &s.connections { (role) ": " (n) " " }
            } }
            tr { th { "waiting acquirers" } td { (s.waiters) } }
        }
        h2 { "Live leases in " (s.here) }
        @match &s.leases {
            Err(e) => p.failed { (e) },
            Ok(leases) if leases.shown.is_empty() => p.muted { "none" },
            Ok(leases) => {
                table #leases {
                    thead { tr { th { "key" } th { "reservation" } th { "actor" } th { "token" } } }
                    tbody { @for record in &leases.shown { (lease_row(record)) } }
                }
                @if leases.more { p.muted { "… and more (the soonest to expire are shown)." } }
            }
        }
        h2 { "Recent events in " (s.here) " (the last " (EVENTS_SHOWN_MAX) ")" }
        @match &s.events {
            Err(e) => p.failed { (e) },
            Ok(events) if events.is_empty() => p.muted { "none yet" },
            Ok(events) => table #events {
                thead { tr { th { "seq" } th { "event" } th { "key" } th { "reservation" } th { "token" } th { "" } } }
                tbody { @for e in events.iter().rev() {
                    tr { td { (e.seq) } td { (e.kind.name()) } td.mono { (e.key) } td.mono { (e.reservation) } td { (e.token.get()) } td { (e.kind.detail()) } }
                } }
            },
        }
    }
}

fn dc_row(row: &DcRow, s: &Snapshot) -> Markup {
    let (state, words) = match &row.reach {
        Reach::Here(Ok(())) => ("here", "this DC, ready".to_string()),
        Reach::Here(Err(why)) => ("unready", format!("this DC, not ready: {why}")),
        Reach::Answers(_) => ("available", "available".to_string()),
        Reach::Unavailable(why) => ("unavailable", format!("unavailable: {why}")),
    };
    let rtt = match &row.reach {
        Reach::Answers(rtt) => ms(*rtt),
        Reach::Here(_) => "—".to_string(),
        Reach::Unavailable(_) => "no answer".to_string(),
    };
    html! {
        tr.dc data-dc=(row.dc) data-state=(state) {
            th { (row.dc) }
            td { span.state.(state) { (words) } }
            td { (lease(row.lease.as_ref())) }
            td.mono { @for addr in &row.instances { (addr) br; } }
            td { (rtt) }
            @if row.dc == s.here {
                td { (leases(s.live_leases_counted, s.sessions_counted)) }
                td { (health(&s.dc_store)) }
            } @else {
                @match &row.report {
                    Some(Ok(report)) => {
                        td { (leases(report.live_leases, report.sessions)) }
                        td { (probe(&report.dc_store)) }
                    }
                    Some(Err(why)) => {
                        td colspan="2" { span.muted title=(why) { "no report" } }
                    }
                    None => { td {} td {} }
                }
            }
        }
    }
}

/// Live leases as a DC counted them at its last upkeep pass: per-key
/// leases, and keys under host sessions when there are any.
fn leases(per_key: u64, sessions: Option<SessionCounts>) -> Markup {
    html! {
        (per_key)
        @if let Some(counted) = sessions.filter(|c| c.keys > 0) {
            " + " (counted.keys) " in " (counted.rows) " sessions"
        }
    }
}

/// A round trip one DC measured to another, or why there was none.
type Measured<'a> = (&'a DcId, Result<Duration, String>);

/// Each DC's round trip to every other, as each measured it (this DC's
/// probes, the others' reports): rows from, columns to.
fn round_trips(s: &Snapshot) -> Markup {
    let mut rows: Vec<(&DcId, Vec<Measured>)> = vec![(
        &s.here,
        s.round_trips
            .iter()
            .map(|(dc, rtt)| (dc, rtt.clone()))
            .collect(),
    )];
    for row in &s.dcs {
        if let Some(Ok(report)) = &row.report {
            let measured = report
                .peers
                .iter()
                .map(|p| {
                    let rtt = match &p.probe {
                        Probe::Answered { micros } => Ok(Duration::from_micros(*micros)),
                        Probe::Failed(why) => Err(why.clone()),
                    };
                    (&p.dc, rtt)
                })
                .collect();
            rows.push((&row.dc, measured));
        }
    }
    let columns: Vec<&DcId> = s.dcs.iter().map(|row| &row.dc).collect();
    html! {
        h2 { "Round trips between DCs" }
        table #round-trips {
            thead { tr { th { "from \\ to" } @for to in &columns { th { (to) } } } }
            tbody {
                @for (from, measured) in &rows {
                    tr data-from=(from) {
                        th { (from) }
                        @for to in &columns {
                            td {
                                @match measured.iter().find(|(dc, _)| dc == to) {
                                    Some((_, Ok(rtt))) => (ms(*rtt)),
                                    Some((_, Err(why))) => span.state.failed title=(why) { "no answer" },
                                    None => span.muted { "—" },
                                }
                            }
                        }
                    }
                }
            }
        }
    }
}

/// A check another DC reported: healthy with its latency, or why not.
fn probe(checked: &Probe) -> Markup {
    match checked {
        Probe::Answered { micros } => health(&Ok(Duration::from_micros(*micros))),
        Probe::Failed(why) => health(&Err(why.clone())),
    }
}

fn lease(state: Option<&DcLeaseState>) -> Markup {
    let Some(state) = state else {
        return html! { span.muted { "not read" } };
    };
    let class = match (state.retired, state.standing) {
        (true, _) => "retired",
        (_, DcStanding::Lapsed { .. }) => "lapsed",
        (_, DcStanding::Expired) => "expired",
        _ => "",
    };
    html! { span class=(class) { (state.words()) } }
}

fn lease_row(record: &DcRecord) -> Markup {
    let actor = match &record.state {
        RecordState::Active { actor, .. } if record.allow_renew => actor.to_string(),
        RecordState::Active { actor, .. } => format!("{actor} (drained)"),
        _ => String::new(),
    };
    html! {
        tr { td.mono { (record.key) } td.mono { (record.id) } td { (actor) } td { (record.token.get()) } }
    }
}

fn health(checked: &Result<Duration, String>) -> Markup {
    html! {
        @match checked {
            Ok(took) => span.state.available { "healthy, " (ms(*took)) },
            Err(e) => span.state.failed { (e) },
        }
    }
}

/// A latency in milliseconds: two decimals below 10 ms (a local store
/// answers in microseconds), one above.
fn ms(d: Duration) -> String {
    let ms = d.as_secs_f64() * 1000.0;
    match ms < 10.0 {
        true => format!("{ms:.2} ms"),
        false => format!("{ms:.1} ms"),
    }
}

#[cfg(test)]
mod tests {
    use std::time::SystemTime;

    use homing_core::DcId;

    use super::*;
    use crate::status::SearchError;

    fn dc(name: &str) -> DcId {
        DcId::new(name).expect("a valid dc id")
    }

    fn snapshot(rows: Vec<DcRow>) -> Snapshot {
        Snapshot {
            seq: 7,
            at: SystemTime::UNIX_EPOCH,
            here: dc("iad"),
            dcs: rows,
            global_read: Ok(()),
            global_store: Ok(Duration::from_micros(1_500)),
            dc_store: Err("dc store: no answer within 2000 ms".to_string()),
            live_leases_counted: 3,
            sessions_counted: None,
            round_trips: vec![(dc("fra"), Ok(Duration::from_millis(12)))],
            leases: Ok(super::super::LiveLeases {
                shown: Vec::new(),
                more: false,
            }),
            events: Ok(Vec::new()),
            connections: vec![("node", 2)],
            waiters: 0,
        }
    }

    fn row(name: &str, reach: Reach) -> DcRow {
        DcRow {
            dc: dc(name),
            lease: Some(DcLeaseState::unknown(dc(name))),
            instances: vec!["127.0.0.1:7000".parse().expect("an address")],
            reach,
            report: None,
        }
    }

    #[test]
    fn each_dc_row_carries_its_state_and_says_why_a_dc_is_unavailable() {
        let html = deployment(&snapshot(vec![
            row("fra", Reach::Answers(Duration::from_millis(12))),
            row("iad", Reach::Here(Ok(()))),
            row(
                "sin",
                Reach::Unavailable("dc sin unavailable: timed out".into()),
            ),
        ]))
        .into_string();
        assert!(
            html.contains(r#"data-dc="fra" data-state="available""#),
            "{html}"
        );
        assert!(
            html.contains(r#"data-dc="iad" data-state="here""#),
            "{html}"
        );
        assert!(
            html.contains(r#"data-dc="sin" data-state="unavailable""#),
            "{html}"
        );
        assert!(
            html.contains("unavailable: dc sin unavailable: timed out"),
            "{html}"
        );
        assert!(html.contains("12.0 ms"), "the round trip: {html}");
        assert!(
            html.contains("no answer within 2000 ms"),
            "a failed store: {html}"
        );
    }

    #[test]
    fn another_dcs_report_shows_its_leases_its_store_and_its_round_trips() {
        let mut fra = row("fra", Reach::Answers(Duration::from_millis(12)));
        fra.report = Some(Ok(homing_core::DcReport {
            live_leases: 41,
            sessions: Some(homing_core::SessionCounts { rows: 2, keys: 700 }),
            dc_store: Probe::Answered { micros: 300 },
            global_store: Probe::Answered { micros: 4_000 },
            peers: vec![
                homing_core::PeerProbe {
                    dc: dc("iad"),
                    probe: Probe::Answered { micros: 11_500 },
                },
                homing_core::PeerProbe {
                    dc: dc("sin"),
                    probe: Probe::Failed("sin: <i>timed out</i>".to_string()),
                },
            ],
        }));
        let mut sin = row("sin", Reach::Unavailable("timed out".into()));
        sin.report = Some(Err("report: <b>no answer</b> within 3000 ms".to_string()));
        let html =
            deployment(&snapshot(vec![fra, row("iad", Reach::Here(Ok(()))), sin])).into_string();
        assert!(html.contains("41 + 700 in 2 sessions"), "{html}");
        assert!(html.contains("healthy, 0.30 ms"), "fra's dc store: {html}");
        assert!(html.contains(r#"<tr data-from="fra">"#), "{html}");
        assert!(html.contains("11.5 ms"), "fra to iad: {html}");
        assert!(html.contains("no report"), "{html}");
        assert!(
            !html.contains("<b>no answer</b>") && !html.contains("<i>timed out</i>"),
            "escaped: {html}"
        );
    }

    #[test]
    fn what_a_peer_or_a_search_says_is_escaped() {
        let search = Search {
            namespace: String::new(),
            name: "<script>alert(1)</script>".to_string(),
            chain: Err(SearchError::BadKey("<b>bad</b>".to_string())),
        };
        let unready = row("iad", Reach::Here(Err("<i>lapsed</i>".into())));
        let html = full(&snapshot(vec![unready]), Some(&search)).into_string();
        assert!(!html.contains("<script>alert"), "{html}");
        assert!(
            html.contains("&lt;script&gt;alert(1)&lt;/script&gt;"),
            "{html}"
        );
        assert!(
            !html.contains("<b>bad</b>") && !html.contains("<i>lapsed</i>"),
            "{html}"
        );
        assert!(html.contains(r#"data-state="unready""#), "{html}");
    }
}
