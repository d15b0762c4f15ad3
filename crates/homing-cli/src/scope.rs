//! Commands over a namespace (and optionally its children) in every DC:
//! `homing watch`, `homing inspect`, and `homing drain` without a key.

use std::collections::BTreeMap;

use anyhow::{Context, bail};
use clap::Args;
use homing_client::{WatchError, Watcher};
use homing_core::{DcId, Event, EventSeq, Namespace, NamespaceScope, Reply, Request};

use crate::reach::Reach;

/// Which namespaces a command covers.
#[derive(Debug, Clone, Args)]
pub struct ScopeArgs {
    /// The namespace; `/` separates levels (`games/eu/lobbies`). Default: the
    /// empty namespace.
    #[arg(long, default_value = "")]
    pub namespace: String,
    /// Also every namespace under --namespace (with the empty namespace: all).
    #[arg(long)]
    pub include_children: bool,
}

impl ScopeArgs {
    /// The scope, validated.
    pub fn scope(&self) -> anyhow::Result<NamespaceScope> {
        Ok(NamespaceScope {
            namespace: Namespace::new(self.namespace.as_str()).context("--namespace")?,
            include_children: self.include_children,
        })
    }
}

/// `homing watch`'s arguments.
#[derive(Debug, Args)]
pub struct WatchArgs {
    #[command(flatten)]
    scope: ScopeArgs,
    /// Resume after these cursors, DC=SEQ, comma-separated (as printed in
    /// each event line); DCs not named start from their oldest kept event.
    #[arg(long, value_delimiter = ',')]
    after: Vec<String>,
    /// Only DCs with these names (default: every DC in --dc).
    #[arg(long = "only", value_delimiter = ',')]
    only: Vec<String>,
    /// Exit after this many events (default: follow until interrupted).
    #[arg(long)]
    count: Option<u64>,
    /// Exit after this many seconds without an event.
    #[arg(long)]
    idle_exit_secs: Option<u64>,
    #[command(flatten)]
    reach: Reach,
}

fn parse_cursors(after: &[String]) -> anyhow::Result<BTreeMap<DcId, EventSeq>> {
    after
        .iter()
        .map(|entry| {
            let (dc, seq) = entry
                .split_once('=')
                .with_context(|| format!("--after {entry:?} is not DC=SEQ"))?;
            let dc = DcId::new(dc).with_context(|| format!("--after {entry:?}"))?;
            let seq = seq
                .parse()
                .with_context(|| format!("--after {entry:?}: sequence number"))?;
            Ok((dc, seq))
        })
        .collect()
}

/// One event as a line: `dc=seq kind key reservation token details`.
pub fn event_line(dc: &DcId, event: &Event) -> String {
    let detail = event.kind.detail();
    let line = format!(
        "{dc}={:<6} {:<9} {:<24} {:<10} token {:<3} {detail}",
        event.seq,
        event.kind.name(),
        event.key.to_string(),
        event.reservation.to_string(),
        event.token.get(),
    );
    line.trim_end().to_string()
}

/// Follows the DCs' event logs, printing one line per event.
pub async fn watch(args: WatchArgs) -> anyhow::Result<bool> {
    let scope = args.scope.scope()?;
    let cursors = parse_cursors(&args.after)?;
    let client = args.reach.client()?;
    let only = args
        .only
        .iter()
        .map(|d| DcId::new(d.as_str()).context("--only"))
        .collect::<anyhow::Result<Vec<_>>>()?;
    let (tx, mut rx) = tokio::sync::mpsc::channel::<(DcId, Result<Event, WatchError>)>(256);
    let mut watching = 0;
    for (dc, _) in args.reach.dcs()? {
        if !only.is_empty() && !only.contains(&dc) {
            continue;
        }
        let peer = args.reach.peer(&dc)?;
        let cursor = cursors.get(&dc).copied().unwrap_or(0);
        let mut watcher = Watcher::new(client.clone(), peer, scope.clone(), cursor);
        let tx = tx.clone();
        watching += 1;
        tokio::spawn(async move {
            loop {
                let next = watcher.next().await;
                let failed = next.is_err();
                if tx.send((dc.clone(), next)).await.is_err() || failed {
                    return;
                }
            }
        });
    }
    drop(tx);
    if watching == 0 {
        bail!("no DC left to watch (check --only against --dc)");
    }
    eprintln!(
        "watching {scope} in {watching} dc(s); each line starts with its resume cursor DC=SEQ"
    );
    let mut seen = 0u64;
    loop {
        let received = match args.idle_exit_secs {
            Some(secs) => {
                match tokio::time::timeout(std::time::Duration::from_secs(secs), rx.recv()).await {
                    Ok(received) => received,
                    Err(_) => {
                        eprintln!("no event for {secs} s; exiting");
                        return Ok(true);
                    }
                }
            }
            None => rx.recv().await,
        };
        let Some((dc, next)) = received else {
            return Ok(true);
        };
        match next {
            Ok(event) => println!("{}", event_line(&dc, &event)),
            Err(e) => bail!("{e}"),
        }
        seen += 1;
        if args.count.is_some_and(|c| seen >= c) {
            return Ok(true);
        }
    }
}

/// `homing inspect` and `homing drain --namespace`'s arguments.
#[derive(Debug, Args)]
pub struct ScopeCommand {
    #[command(flatten)]
    pub scope: ScopeArgs,
    #[command(flatten)]
    pub reach: Reach,
}

/// Lists every record in scope, DC by DC, in key order.
pub async fn inspect(args: ScopeCommand) -> anyhow::Result<bool> {
    let scope = args.scope.scope()?;
    let client = args.reach.client()?;
    for (dc, _) in args.reach.dcs()? {
        let peer = args.reach.peer(&dc)?;
        let mut after = None;
        let mut count = 0;
        println!("dc {dc}:");
        loop {
            let request = Request::Scan {
                scope: scope.clone(),
                after: after.take(),
            };
            match client.request(&peer, &request).await? {
                Reply::Records { records, next } => {
                    for record in &records {
                        println!("   {}", crate::show::record(record));
                    }
                    count += records.len();
                    match next {
                        Some(next) => after = Some(next),
                        None => break,
                    }
                }
                Reply::Error(e) => bail!("dc {dc}: {e}"),
                other => bail!(
                    "dc {dc} answered a scan with {}",
                    crate::show::reply_kind(&other)
                ),
            }
        }
        println!("   {count} record(s) in {scope}");
    }
    Ok(true)
}

/// Drains every live lease in scope in every DC.
pub async fn drain(args: ScopeCommand) -> anyhow::Result<bool> {
    let scope = args.scope.scope()?;
    let client = args.reach.client()?;
    let mut total = 0;
    for (dc, _) in args.reach.dcs()? {
        let peer = args.reach.peer(&dc)?;
        let mut after = None;
        let mut drained = 0;
        loop {
            let request = Request::DrainScope {
                scope: scope.clone(),
                after: after.take(),
            };
            match client.request(&peer, &request).await? {
                Reply::DrainedPage {
                    drained: page,
                    next,
                } => {
                    drained += page;
                    match next {
                        Some(next) => after = Some(next),
                        None => break,
                    }
                }
                Reply::Error(e) => bail!("dc {dc}: {e}"),
                other => bail!(
                    "dc {dc} answered a drain with {}",
                    crate::show::reply_kind(&other)
                ),
            }
        }
        println!("dc {dc}: drained {drained} live lease(s) in {scope}");
        total += drained;
    }
    println!("{total} lease(s) drained: their hosts stop by their deadlines");
    Ok(true)
}
