//! `homing dc status`, `homing dc retire` and `homing dc directory`: what
//! the global store keeps about each DC — its DC lease, the marks it
//! published, whether it was retired (DESIGN.md §7.5), which homingd serve
//! it (the DC directory) — and whether each DC's homingd answers.

use std::time::{Duration, Instant};

use clap::{Args, Subcommand};
use homing_core::{
    DcId, DcLeaseState, DcReport, DcStanding, Probe, Reply, Request, SuccessionCause,
};
use homing_daemon::{OpenMode, StoreOpener, StoreSpec};
use homing_store::{GET_MANY_KEYS_MAX, GlobalStore, SuccessionPages};
use serde_json::json;

use crate::JsonArg;
use crate::exit::{BadInput, Exit, fail};
use crate::reach::Reach;

/// How long `status` waits for each DC's homingd.
const PROBE_TIMEOUT: Duration = Duration::from_secs(2);
/// How long `status` waits for each DC's report: the DC times its stores
/// (2 s at most each) and its peers (their timeout) before it answers.
const REPORT_TIMEOUT: Duration = Duration::from_secs(8);

/// Most successions `status` reads per DC to count its takeovers (they
/// include every move out of the DC: the count says "at least" past this).
const SUCCESSIONS_COUNTED_MAX: usize = 32 * GET_MANY_KEYS_MAX;

/// How many of `dc`'s reservations other DCs took over, reading at most
/// [`SUCCESSIONS_COUNTED_MAX`] successions; whether it read them all.
async fn takeovers(global: &dyn GlobalStore, dc: &DcId) -> anyhow::Result<(usize, bool)> {
    let mut pages = SuccessionPages::of(dc.clone());
    let (mut taken, mut read) = (0, 0);
    while let Some(page) = pages.next(global).await? {
        read += page.len();
        taken += page
            .iter()
            .filter(|s| s.cause == SuccessionCause::TakenOver)
            .count();
        if read >= SUCCESSIONS_COUNTED_MAX && !pages.finished() {
            return Ok((taken, false));
        }
    }
    Ok((taken, true))
}

/// Every DC's lease and reachability, or one DC's retirement.
#[derive(Debug, Subcommand)]
pub enum DcCommand {
    /// Every DC the global store knows: its DC lease (live with the time
    /// left, lapsed — granting nothing, its hosts stopping — or expired),
    /// the marks it published (reservation IDs and fencing tokens it may
    /// have used), whether it was retired, how many of its keys other DCs
    /// took over after its lease expired; and, for the DCs in --dc,
    /// whether their homingd answers (a resolve that reads the DC's global
    /// store; an error answer is an error) and how fast, and what each
    /// reports of itself: live leases (per key, and keys under host
    /// sessions) at its last upkeep pass, its DC store's health check, and
    /// its round trip to every other DC (a table below the DCs).
    Status(StatusArgs),
    /// Retire a DC for good: the global store refuses its lease from now on
    /// (a lease it holds runs out by its terms, and its hosts stop by their
    /// deadlines), and a homingd started under its id is refused. Use it for
    /// a DC that is gone and will not come back under that id.
    Retire(RetireArgs),
    /// The DC directory: which homingd serve each DC, at which address.
    /// Every homingd lists itself at start (its --advertise address);
    /// peers and routers learn new DCs from it without a restart. A homingd
    /// that is gone for good stays listed (its peers and routers hold it
    /// suspect) until --remove takes it out.
    Directory(DirectoryArgs),
    /// The deployment version: the protocol version features may rely on
    /// every homingd speaking. Every release speaks its own version and the
    /// previous one, so processes are upgraded one at a time; once all are,
    /// --raise switches on what needs the new version everywhere. It asks
    /// every homingd listed in the DC directory (with the certificates of
    /// --certs) and raises only if each speaks the new version. --lower
    /// rolls back, until something was written in the new version's form.
    /// A homingd of this release refuses to start in a deployment whose
    /// version is newer than it speaks.
    Version(VersionArgs),
}

/// `homing dc version`.
#[derive(Debug, Args)]
pub struct VersionArgs {
    /// The deployment's stores (same forms as `status`).
    #[arg(long, value_name = "SPEC")]
    stores: StoreSpec,
    /// Raise the deployment version by one, if every listed homingd speaks it.
    #[arg(long, conflicts_with = "lower")]
    raise: bool,
    /// Lower the deployment version by one (a rollback), if nothing was
    /// written in its form yet.
    #[arg(long)]
    lower: bool,
    #[command(flatten)]
    reach: Reach,
    #[command(flatten)]
    json: JsonArg,
}

/// `homing dc directory`.
#[derive(Debug, Args)]
pub struct DirectoryArgs {
    /// The deployment's stores (same forms as `status`).
    #[arg(long, value_name = "SPEC")]
    stores: StoreSpec,
    /// Take DC=ADDR (one homingd) or DC (every homingd of the DC) out of
    /// the directory; repeatable. Running peers and routers keep what they
    /// learned; new ones do not learn it.
    #[arg(long, value_name = "DC[=ADDR]")]
    remove: Vec<String>,
    #[command(flatten)]
    json: JsonArg,
}

/// `homing dc status`.
#[derive(Debug, Args)]
pub struct StatusArgs {
    /// The deployment's stores (redb:DIR, etcd:HOST:PORT[?prefix=P], fdb:[FILE][?prefix=P]).
    #[arg(long, value_name = "SPEC")]
    stores: StoreSpec,
    #[command(flatten)]
    reach: Reach,
    #[command(flatten)]
    json: JsonArg,
}

/// `homing dc retire`.
#[derive(Debug, Args)]
pub struct RetireArgs {
    /// The DC to retire.
    dc: String,
    /// The deployment's stores (same forms as `status`).
    #[arg(long, value_name = "SPEC")]
    stores: StoreSpec,
    /// Confirm: retiring cannot be undone.
    #[arg(long)]
    yes: bool,
    #[command(flatten)]
    json: JsonArg,
}

/// Runs a `homing dc` command.
pub async fn run(command: DcCommand) -> anyhow::Result<()> {
    let json = match &command {
        DcCommand::Status(args) => args.json.json,
        DcCommand::Retire(args) => args.json.json,
        DcCommand::Directory(args) => args.json.json,
        DcCommand::Version(args) => args.json.json,
    };
    // A failure is printed as JSON too.
    crate::JSON.store(json, std::sync::atomic::Ordering::Relaxed);
    match command {
        DcCommand::Status(args) => status(args).await,
        DcCommand::Retire(args) => retire(args).await,
        DcCommand::Directory(args) => directory(args).await,
        DcCommand::Version(args) => version(args).await,
    }
}

/// The protocol version each homingd listed in `directory` speaks with this
/// CLI (the newest both speak), or why it could not be asked.
async fn versions_spoken(
    reach: &Reach,
    directory: &homing_core::Directory,
) -> anyhow::Result<Vec<(DcId, std::net::SocketAddr, Result<u16, String>)>> {
    let client = reach.client()?;
    let mut spoken = Vec::new();
    for (dc, addr) in directory.addresses() {
        let peer = homing_net::Peer {
            addr,
            dc: dc.clone(),
        };
        let version = match tokio::time::timeout(PROBE_TIMEOUT, client.version(&peer)).await {
            Ok(Ok(version)) => Ok(version),
            Ok(Err(e)) => Err(e.to_string()),
            Err(_) => Err(format!(
                "no handshake within {} ms",
                PROBE_TIMEOUT.as_millis()
            )),
        };
        spoken.push((dc.clone(), addr, version));
    }
    Ok(spoken)
}

async fn version(args: VersionArgs) -> anyhow::Result<()> {
    use homing_store::deployment;
    let global = StoreOpener::new()
        .global(&args.stores, OpenMode::MustExist)
        .await?;
    let global = global.as_ref();
    let before = deployment::read(global).await?;
    let change_failed = |e: deployment::VersionChangeError| match e {
        deployment::VersionChangeError::Store(e) => anyhow::Error::from(e),
        other => fail(Exit::Refused, other.to_string()),
    };
    let after = if args.raise {
        let target = before.version + 1;
        let directory = homing_store::directory::read(global).await?;
        if directory.dcs().is_empty() {
            return Err(fail(
                Exit::Refused,
                "no homingd is listed in the dc directory: nothing says which versions the deployment speaks",
            ));
        }
        let spoken = versions_spoken(&args.reach, &directory).await?;
        let behind: Vec<String> = spoken
            .iter()
            .filter_map(|(dc, addr, v)| match v {
                Ok(v) if *v >= target => None,
                Ok(v) => Some(format!("{dc} at {addr} speaks {v}")),
                Err(e) => Some(format!("{dc} at {addr} did not answer: {e}")),
            })
            .collect();
        if !behind.is_empty() {
            return Err(fail(
                Exit::Refused,
                format!(
                    "not raised to {target}: not every listed homingd speaks it ({}); upgrade them, or take one that is gone for good out with `homing dc directory --remove`",
                    behind.join("; ")
                ),
            ));
        }
        let after = deployment::raise(global).await.map_err(change_failed)?;
        tracing::warn!(
            version = after.version,
            "deployment version raised by an operator"
        );
        after
    } else if args.lower {
        let after = deployment::lower(global).await.map_err(change_failed)?;
        tracing::warn!(
            version = after.version,
            "deployment version lowered by an operator"
        );
        after
    } else {
        before
    };
    if args.json.json {
        println!(
            "{}",
            json!({
                "outcome": "ok",
                "version": after.version,
                "was": before.version,
                "new_form_written": after.new_form_written,
            })
        );
    } else if after != before {
        println!(
            "deployment version {} (was {})",
            after.version, before.version
        );
    } else {
        let lowerable = match after.new_form_written {
            true => "; something was written in its form: it cannot be lowered",
            false => "",
        };
        println!("deployment version {}{lowerable}", after.version);
    }
    Ok(())
}

/// `DC` or `DC=ADDR` of `--remove`.
fn removal(text: &str) -> anyhow::Result<(DcId, Option<std::net::SocketAddr>)> {
    let (dc, addr) = match text.split_once('=') {
        Some((dc, addr)) => (dc, Some(addr)),
        None => (text, None),
    };
    let dc = DcId::new(dc).bad_input("--remove DC")?;
    let addr = addr
        .map(|a| a.parse::<std::net::SocketAddr>())
        .transpose()
        .bad_input("--remove DC=ADDR: address")?;
    Ok((dc, addr))
}

async fn directory(args: DirectoryArgs) -> anyhow::Result<()> {
    let removals = args
        .remove
        .iter()
        .map(|text| removal(text))
        .collect::<anyhow::Result<Vec<_>>>()?;
    let global = StoreOpener::new()
        .global(&args.stores, OpenMode::MustExist)
        .await?;
    let directory = if removals.is_empty() {
        homing_store::directory::read(global.as_ref()).await?
    } else {
        let removed = homing_store::directory::update(global.as_ref(), |d| {
            Ok(removals
                .iter()
                .fold(d.clone(), |d, (dc, addr)| d.without(dc, *addr)))
        })
        .await?;
        for (dc, addr) in &removals {
            let which = addr.map_or_else(|| "every homingd".to_string(), |a| a.to_string());
            tracing::warn!(dc = %dc, which = %which, "removed from the dc directory by an operator");
        }
        removed
    };
    if args.json.json {
        let dcs: Vec<_> = directory
            .dcs()
            .iter()
            .map(|d| json!({ "dc": d.dc.as_str(), "addrs": d.addrs.iter().map(|a| a.to_string()).collect::<Vec<_>>() }))
            .collect();
        println!("{}", json!({ "outcome": "ok", "dcs": dcs }));
        return Ok(());
    }
    if directory.dcs().is_empty() {
        println!("no homingd is listed in the dc directory of this global store");
        return Ok(());
    }
    println!("{:<12} homingd", "DC");
    for d in directory.dcs() {
        let addrs: Vec<String> = d.addrs.iter().map(|a| a.to_string()).collect();
        println!("{:<12} {}", d.dc.as_str(), addrs.join(", "));
    }
    Ok(())
}

async fn status(args: StatusArgs) -> anyhow::Result<()> {
    let table = if args.reach.dcs.is_empty() {
        Vec::new()
    } else {
        args.reach.dcs()?
    };
    let global = StoreOpener::new()
        .global(&args.stores, OpenMode::MustExist)
        .await?;
    let mut states = global.dc_leases().await?;
    for (dc, _) in &table {
        if !states.iter().any(|s| &s.dc == dc) {
            states.push(DcLeaseState::unknown(dc.clone()));
        }
    }
    states.sort_by(|a, b| a.dc.cmp(&b.dc));
    let asker: Asker = match table.is_empty() {
        true => Err("no --dc".to_string()),
        false => args.reach.client().map_err(|e| format!("{e:#}")),
    };
    let mut rows = Vec::new();
    for state in &states {
        let (reach, report) = match table.iter().any(|(dc, _)| dc == &state.dc) {
            true => {
                let (reach, report) = tokio::join!(
                    probe(&asker, &args.reach, &state.dc),
                    report(&asker, &args.reach, &state.dc)
                );
                (Some(reach), Some(report))
            }
            false => (None, None),
        };
        let taken = takeovers(global.as_ref(), &state.dc).await?;
        rows.push(Row {
            state,
            reach,
            report,
            taken,
        });
    }
    if args.json.json {
        let dcs: Vec<_> = rows.iter().map(Row::json).collect();
        println!("{}", json!({ "outcome": "ok", "dcs": dcs }));
        return Ok(());
    }
    if rows.is_empty() {
        println!("no DC has held a DC lease in this global store yet");
        return Ok(());
    }
    println!(
        "{:<12} {:<34} {:>14} {:>14} {:>11} {:>8} {:>13} {:>9}  homingd",
        "DC",
        "DC LEASE",
        "IDS UP TO",
        "TOKENS UP TO",
        "TAKEN OVER",
        "LEASES",
        "SESSION KEYS",
        "DC STORE"
    );
    for row in &rows {
        let (taken, complete) = row.taken;
        let taken = match complete {
            true => taken.to_string(),
            false => format!("≥{taken}"),
        };
        let homingd = match &row.reach {
            None => "not in --dc".to_string(),
            Some(Ok(ms)) => format!("answers in {ms:.1} ms"),
            Some(Err(e)) => e.clone(),
        };
        let report = row.report.as_ref().and_then(|r| r.as_ref().ok());
        let leases = report.map_or("-".to_string(), |r| r.live_leases.to_string());
        let session_keys = report
            .and_then(|r| r.sessions)
            .map_or("-".to_string(), |s| s.keys.to_string());
        let store = report.map_or("-".to_string(), |r| probe_words(&r.dc_store));
        println!(
            "{:<12} {:<34} {:>14} {:>14} {taken:>11} {leases:>8} {session_keys:>13} {store:>9}  {homingd}",
            row.state.dc.as_str(),
            row.state.words(),
            row.state.marks.allocator_floor,
            row.state.marks.token_bound
        );
    }
    print_report_details(&rows);
    Ok(())
}

/// One DC in `homing dc status`.
struct Row<'a> {
    state: &'a DcLeaseState,
    /// The resolve probe's round trip in ms (`None`: not in --dc).
    reach: Option<Result<f64, String>>,
    /// What the DC reported of itself (`None`: not in --dc).
    report: Option<Result<DcReport, String>>,
    /// Keys taken over from it, and whether all were counted.
    taken: (usize, bool),
}

impl Row<'_> {
    fn json(&self) -> serde_json::Value {
        let mut row = row_json(self.state, self.reach.as_ref());
        row["taken_over"] = json!(self.taken.0);
        row["taken_over_complete"] = json!(self.taken.1);
        match &self.report {
            None => {}
            Some(Ok(report)) => row["report"] = report_json(report),
            Some(Err(e)) => row["report_error"] = json!(e),
        }
        row
    }
}

/// A store check or peer round trip in a table cell: its time, or "failed".
fn probe_words(probe: &Probe) -> String {
    match probe {
        Probe::Answered { micros } => format!("{:.1} ms", *micros as f64 / 1000.0),
        Probe::Failed(_) => "failed".to_string(),
    }
}

fn probe_json(probe: &Probe) -> serde_json::Value {
    match probe {
        Probe::Answered { micros } => json!({ "ms": *micros as f64 / 1000.0 }),
        Probe::Failed(why) => json!({ "error": why }),
    }
}

fn report_json(report: &DcReport) -> serde_json::Value {
    let peers: serde_json::Map<String, serde_json::Value> = report
        .peers
        .iter()
        .map(|p| (p.dc.to_string(), probe_json(&p.probe)))
        .collect();
    json!({
        "live_leases": report.live_leases,
        "sessions": report.sessions.map(|s| s.rows),
        "session_keys": report.sessions.map(|s| s.keys),
        "dc_store": probe_json(&report.dc_store),
        "global_store": probe_json(&report.global_store),
        "round_trips": peers,
    })
}

/// Below the DC table: each reporting DC's round trip to every other DC (a
/// matrix, from the row's DC to the column's), then every failed check and
/// every report that did not come, in words.
fn print_report_details(rows: &[Row<'_>]) {
    let reports: Vec<(&DcId, &DcReport)> = rows
        .iter()
        .filter_map(|row| match &row.report {
            Some(Ok(report)) => Some((&row.state.dc, report)),
            _ => None,
        })
        .collect();
    let mut columns: Vec<&DcId> = reports
        .iter()
        .flat_map(|(_, r)| r.peers.iter().map(|p| &p.dc))
        .collect();
    columns.sort();
    columns.dedup();
    if !columns.is_empty() {
        println!("\nround trips, ms (from each DC in --dc to the DCs in its peer table):");
        print!("{:<12}", "FROM \\ TO");
        for to in &columns {
            print!(" {:>9}", to.as_str());
        }
        println!();
        for (from, report) in &reports {
            print!("{:<12}", from.as_str());
            for to in &columns {
                let cell = match report.peers.iter().find(|p| &&p.dc == to) {
                    Some(peer) => match &peer.probe {
                        Probe::Answered { micros } => format!("{:.1}", *micros as f64 / 1000.0),
                        Probe::Failed(_) => "failed".to_string(),
                    },
                    None => "-".to_string(),
                };
                print!(" {cell:>9}");
            }
            println!();
        }
    }
    let mut problems = Vec::new();
    for row in rows {
        let dc = &row.state.dc;
        match &row.report {
            Some(Err(e)) => problems.push(format!("{dc}: no report: {e}")),
            Some(Ok(report)) => {
                let checks = [
                    ("dc store", &report.dc_store),
                    ("global store", &report.global_store),
                ];
                for (what, probe) in checks {
                    if let Probe::Failed(why) = probe {
                        problems.push(format!("{dc}: {what} check failed: {why}"));
                    }
                }
                for peer in &report.peers {
                    if let Probe::Failed(why) = &peer.probe {
                        problems.push(format!("{dc}: no answer from {}: {why}", peer.dc));
                    }
                }
            }
            None => {}
        }
    }
    if !problems.is_empty() {
        println!();
        for problem in problems {
            println!("{problem}");
        }
    }
}

async fn retire(args: RetireArgs) -> anyhow::Result<()> {
    let dc = DcId::new(args.dc.as_str()).bad_input("DC")?;
    if !args.yes {
        return Err(fail(
            Exit::BadInput,
            format!(
                "retiring {dc} cannot be undone: its lease is refused for good and a homingd started as {dc} is refused; run again with --yes"
            ),
        ));
    }
    let global = StoreOpener::new()
        .global(&args.stores, OpenMode::MustExist)
        .await?;
    let before = global.dc_lease(&dc).await?;
    if before.standing == DcStanding::Unknown && !before.retired {
        eprintln!(
            "warning: {dc} never held a DC lease in this global store (a typo?); it is retired all the same, and a homingd started as {dc} will be refused"
        );
    }
    let state = global.retire_dc(&dc).await?;
    tracing::warn!(dc = %dc, "dc retired by an operator");
    // Its homingd are refused from now on: new peers and routers need not
    // learn their addresses.
    homing_store::directory::update(global.as_ref(), |d| Ok(d.without(&dc, None))).await?;
    if args.json.json {
        println!(
            "{}",
            json!({ "outcome": "ok", "dc": row_json(&state, None) })
        );
    } else {
        println!(
            "{dc} retired: its DC lease is refused from now on ({}); a homingd started as {dc} is refused; it is out of the dc directory",
            state.words()
        );
    }
    Ok(())
}

fn standing_name(standing: &DcStanding) -> &'static str {
    match standing {
        DcStanding::Unknown => "unknown",
        DcStanding::Live { .. } => "live",
        DcStanding::Lapsed { .. } => "lapsed",
        DcStanding::Expired => "expired",
    }
}

fn row_json(state: &DcLeaseState, reach: Option<&Result<f64, String>>) -> serde_json::Value {
    let (remaining_ms, expires_in_ms) = match state.standing {
        DcStanding::Live { remaining_ms } => (Some(remaining_ms), None),
        DcStanding::Lapsed { expires_in_ms } => (None, Some(expires_in_ms)),
        _ => (None, None),
    };
    json!({
        "dc": state.dc.as_str(),
        "lease": standing_name(&state.standing),
        "remaining_ms": remaining_ms,
        "expires_in_ms": expires_in_ms,
        "retired": state.retired,
        "allocator_floor": state.marks.allocator_floor,
        "token_bound": state.marks.token_bound,
        "ttl_ms": state.terms.map(|t| t.ttl_ms),
        "homingd_rtt_ms": reach.and_then(|r| r.as_ref().ok().copied()),
        "homingd_error": reach.and_then(|r| r.as_ref().err().cloned()),
    })
}

/// The client `status` asks every DC in --dc with (one handshake per DC
/// for the probe and the report together), or why there is none.
type Asker = Result<homing_net::Client, String>;

/// `request` to `dc`'s homingd within `timeout`: its answer, or in words an
/// error answer, none, or none in time.
async fn ask(
    asker: &Asker,
    reach: &Reach,
    dc: &DcId,
    request: &Request,
    timeout: Duration,
) -> Result<Reply, String> {
    let client = asker.as_ref().map_err(Clone::clone)?;
    let peer = reach.peer(dc).map_err(|e| e.to_string())?;
    match tokio::time::timeout(timeout, client.request(&peer, request)).await {
        Ok(Ok(Reply::Error(e))) => Err(format!("answers with an error: {e}")),
        Ok(Ok(reply)) => Ok(reply),
        Ok(Err(e)) => Err(format!("no answer: {e}")),
        Err(_) => Err(format!("no answer: none within {} ms", timeout.as_millis())),
    }
}

/// What `dc`'s homingd reports of its DC; an error answer, a homingd too
/// old to report (protocol version 9 or older) or none in time, in words.
async fn report(asker: &Asker, reach: &Reach, dc: &DcId) -> Result<DcReport, String> {
    match ask(asker, reach, dc, &Request::DcReport, REPORT_TIMEOUT).await? {
        Reply::DcReport(report) => Ok(report),
        other => Err(format!("answers with {}", crate::show::reply_kind(&other))),
    }
}

/// One round trip to `dc`'s homingd, in ms: a resolve of the global
/// store's health-probe key (which nobody reserves), so the DC reads its
/// global store. An error answer (its global store down, say) is an error,
/// not an answer.
async fn probe(asker: &Asker, reach: &Reach, dc: &DcId) -> Result<f64, String> {
    let request = Request::Resolve {
        key: homing_store::global::health_probe_key(),
    };
    let started = Instant::now();
    ask(asker, reach, dc, &request, PROBE_TIMEOUT).await?;
    Ok(started.elapsed().as_secs_f64() * 1000.0)
}
