//! `homing migrate`: copies a deployment's stores — global entries, every
//! DC's successions and lease entry (marks, retirement) and settings, and
//! each DC's host session rows, records, events and allocator — from one
//! backend to another,
//! offline, resumably, then verifies the copy. The work is
//! `homing_store::migrate`'s; this module opens the stores homingd's way,
//! draws the progress line and sets the exit status.

use std::io::{IsTerminal, Write};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::Context;
use clap::Args;
use homing_core::DcId;
use homing_daemon::stores::OpenError;
use homing_daemon::{OpenMode, StoreOpener, StoreSpec};
use homing_store::migrate::{
    self, MigrateOptions, MigrateReport, Progress, SAMPLE_DEFAULT, SAMPLE_MAX, StoreSet,
    Verification,
};
use homing_store::{DcStore, GlobalStore, MemoryDcStore, MemoryGlobalStore};

use crate::exit::{BadInput, Exit, fail};

/// The long help's examples and notes (`homing migrate --help`).
pub const LONG_HELP: &str = "\
Store specs (homingd's layout on every backend):
  redb:DIR                 DIR/global.redb and DIR/dc-<dc>.redb: homingd's data_dir
  redb:DIR?layout=devnet   DIR/global.redb and DIR/<dc>/dc-<dc>.redb: homing devnet --data-dir
  etcd:HOST:PORT[,HOST:PORT…][?prefix=P]
                           keys under P/global/ and P/dc/<dc>/, P being homingd's
                           store_prefix (default /homing/default); needs --features etcd
  fdb:[CLUSTER_FILE][?prefix=P]
                           the same prefixes in FoundationDB (default cluster file:
                           the platform's); needs --features fdb

Stop every homingd of the deployment first: a live daemon changes records
while they are copied (a redb store a homingd has open is locked and
refused). The target's DC stores are marked while they are copied, and
homingd refuses to start on a marked store until a run verified the copy
(every backend keeps the mark). A redb source must
exist; a target is created as needed. The target's allocator is raised above the source's first, so it
never hands out a reservation ID the source used. Items already at the target
and equal are skipped, so an interrupted migration is finished by running the
same command again. A global entry, succession, setting, host session row,
record or event the target holds with other contents is a conflict: reported with both values,
never overwritten. Every succession (a move or takeover of a reservation) is
copied before anything could take over at the target, then every DC's lease
entry (its marks, which takeovers count above, and its retirement); both are
verified one by one, as is every DC's host session row (copied before the
records held under it).

Examples:
  # A single-node start (data_dir /var/lib/homing, DC iad) moves to etcd.
  # First see what would happen:
  homing migrate --from redb:/var/lib/homing \\
      --to 'etcd:10.0.0.5:2379,10.0.0.6:2379,10.0.0.7:2379?prefix=/homing/prod' \\
      --dcs iad --dry-run
  # Copy and verify (run it again to resume after an interruption):
  homing migrate --from redb:/var/lib/homing \\
      --to 'etcd:10.0.0.5:2379?prefix=/homing/prod' --dcs iad
  # Check a finished migration again, comparing 1000 sampled items of each kind:
  homing migrate --from redb:/var/lib/homing \\
      --to 'etcd:10.0.0.5:2379?prefix=/homing/prod' --dcs iad --verify-only --sample 1000
  # The stores `homing devnet --data-dir /tmp/dn` left behind, into fresh redb files:
  homing migrate --from 'redb:/tmp/dn?layout=devnet' --to redb:/tmp/copy --dcs iad,fra,sin

Then point homingd at the new stores (dc_store, global_store,
etcd_endpoints, store_prefix) and start it.

Exit status: 0 copied and verified (or, with --dry-run, no conflict found);
1 conflicts, a verification mismatch or another error; 2 bad input (flags,
--dcs, a missing redb source); 69 a store did not answer, or a redb store is
held by a running homingd (re-run to resume).";

/// Options of `homing migrate`.
#[derive(Debug, Args)]
pub struct MigrateArgs {
    /// The stores to copy from (a spec: redb:DIR, etcd:HOST:PORT[?prefix=P], fdb:[FILE][?prefix=P]).
    #[arg(long, value_name = "SPEC")]
    from: StoreSpec,
    /// The stores to copy into (same forms); created as needed.
    #[arg(long, value_name = "SPEC")]
    to: StoreSpec,
    /// Every DC whose DC store to copy, comma-separated (the global store is always copied).
    #[arg(long, value_delimiter = ',', required = true, value_name = "DC,…")]
    dcs: Vec<String>,
    /// Read both sides and report what would be copied, what is already
    /// there and what conflicts; write nothing.
    #[arg(long)]
    dry_run: bool,
    /// How many records and events per DC, and global entries, verification
    /// compares field by field, spread evenly over the key space (0: counts only).
    #[arg(long, value_name = "N", default_value_t = SAMPLE_DEFAULT)]
    sample: usize,
    /// Copy nothing: verify an earlier migration (counts, allocator floors,
    /// event heads, every setting, succession and DC lease, and the sample).
    #[arg(long, conflicts_with = "dry_run")]
    verify_only: bool,
}

/// Runs `homing migrate`; `Ok(false)` on conflicts or a verification mismatch.
pub async fn run(args: MigrateArgs) -> anyhow::Result<bool> {
    let dcs = dc_ids(&args.dcs)?;
    if args.sample > SAMPLE_MAX {
        return Err(fail(
            Exit::BadInput,
            format!("--sample {} is over the limit of {SAMPLE_MAX}", args.sample),
        ));
    }
    if args.from == args.to {
        return Err(fail(
            Exit::BadInput,
            format!("--from and --to name the same stores ({})", args.from),
        ));
    }
    // Declared first, so dropped last: it owns what the stores share.
    let mut opener = StoreOpener::new();
    let source = opener
        .set(&args.from, &dcs, OpenMode::MustExist)
        .await
        .with_context(|| format!("--from {}", args.from))?;
    let target = if args.dry_run {
        open_for_reading(&mut opener, &args.to, &dcs).await
    } else if args.verify_only {
        opener.set(&args.to, &dcs, OpenMode::MustExist).await
    } else {
        opener.set(&args.to, &dcs, OpenMode::Create).await
    }
    .with_context(|| format!("--to {}", args.to))?;

    eprintln!(
        "homing migrate: {} → {} (DCs {}){}",
        args.from,
        args.to,
        args.dcs.join(","),
        if args.dry_run { ", dry run" } else { "" }
    );
    let mut bar = Bar::new(std::io::stderr().is_terminal());
    let mut progress = |p: &Progress| bar.update(p);
    if args.verify_only {
        let verification = migrate::verify(&source, &target, args.sample, &mut progress)
            .await
            .context("verification stopped")?;
        bar.finish();
        println!("{verification}");
        return Ok(verification.ok() && !empty_source(&verification, &dcs));
    }
    let options = MigrateOptions {
        dry_run: args.dry_run,
        sample: args.sample,
    };
    let report = migrate::migrate(&source, &target, &options, &mut progress)
        .await
        .context("migration stopped part way: run the same command again to resume")?;
    bar.finish();
    println!("{report}");
    Ok(report.ok() && !empty_report(&report))
}

fn dc_ids(names: &[String]) -> anyhow::Result<Vec<DcId>> {
    let mut dcs: Vec<DcId> = Vec::with_capacity(names.len());
    for name in names {
        let dc = DcId::new(name.as_str()).bad_input(format!("--dcs {name:?}"))?;
        if dcs.contains(&dc) {
            return Err(fail(Exit::BadInput, format!("--dcs names {dc} twice")));
        }
        dcs.push(dc);
    }
    Ok(dcs)
}

/// The target of a dry run: what exists, and an empty stand-in for a redb
/// file that does not exist yet (a dry run creates nothing).
async fn open_for_reading(
    opener: &mut StoreOpener,
    spec: &StoreSpec,
    dcs: &[DcId],
) -> Result<StoreSet, OpenError> {
    let global: Arc<dyn GlobalStore> = match opener.global(spec, OpenMode::MustExist).await {
        Err(OpenError::Missing { .. }) => Arc::new(MemoryGlobalStore::new()),
        other => other?,
    };
    let mut stores = Vec::with_capacity(dcs.len());
    for dc in dcs {
        let store: Arc<dyn DcStore> = match opener.dc(spec, dc, OpenMode::MustExist).await {
            Err(OpenError::Missing { .. }) => Arc::new(MemoryDcStore::new()),
            other => other?,
        };
        stores.push((dc.clone(), store));
    }
    Ok(StoreSet {
        global,
        dcs: stores,
    })
}

/// Warns about DCs with nothing at the source; true when the whole source
/// is empty (almost always a wrong path, prefix or DC name).
fn warn_empty(global: u64, per_dc: impl Iterator<Item = (DcId, u64)>) -> bool {
    let mut total = global;
    for (dc, items) in per_dc {
        if items == 0 {
            eprintln!("warning: the source has no records and no events of DC {dc}");
        }
        total += items;
    }
    if total == 0 {
        eprintln!(
            "warning: the source is empty: check --from (directory, layout, prefix) and --dcs"
        );
    }
    total == 0
}

fn empty_report(report: &MigrateReport) -> bool {
    let items = |t: &migrate::Tally| t.copied + t.present + t.conflicts;
    warn_empty(
        items(&report.global)
            + items(&report.settings)
            + items(&report.successions)
            + items(&report.dc_leases),
        report
            .dcs
            .iter()
            .map(|d| (d.dc.clone(), items(&d.records) + items(&d.events))),
    )
}

fn empty_source(v: &Verification, dcs: &[DcId]) -> bool {
    warn_empty(
        v.global.source + v.settings.source + v.successions.source + v.dc_leases.source,
        dcs.iter()
            .zip(&v.dcs)
            .map(|(dc, d)| (dc.clone(), d.records.source + d.events.source)),
    )
}

/// Most redraws of the progress line per second.
const REDRAW_INTERVAL_MS: u64 = 100;
/// Width of the bar, in characters.
const BAR_CHARS: u64 = 30;

/// The progress line on stderr: redrawn in place on a terminal (one line
/// kept per finished step), one line per finished step otherwise.
struct Bar {
    terminal: bool,
    current: Option<(Progress, Instant)>,
    drawn_at: Option<Instant>,
}

impl Bar {
    fn new(terminal: bool) -> Bar {
        Bar {
            terminal,
            current: None,
            drawn_at: None,
        }
    }

    fn update(&mut self, p: &Progress) {
        let same_step = matches!(&self.current, Some((c, _)) if c.step == p.step);
        if !same_step {
            self.finish();
            self.current = Some((p.clone(), Instant::now()));
        } else if let Some((current, _)) = &mut self.current {
            *current = p.clone();
        }
        let due = self
            .drawn_at
            .is_none_or(|at| at.elapsed() >= Duration::from_millis(REDRAW_INTERVAL_MS));
        if self.terminal && due {
            self.draw("");
        }
    }

    /// Ends the current step's line.
    fn finish(&mut self) {
        if self.current.is_some() {
            self.draw("\n");
        }
        self.current = None;
        self.drawn_at = None;
    }

    fn draw(&mut self, end: &str) {
        let Some((p, started)) = &self.current else {
            return;
        };
        let secs = started.elapsed().as_secs_f64();
        // A rate over less than a second says little.
        let rate = if secs >= 1.0 {
            format!(" {:.0}/s", p.done as f64 / secs)
        } else {
            String::new()
        };
        let line = match p.total {
            Some(total) => {
                let filled = (p.done.min(total) * BAR_CHARS)
                    .checked_div(total)
                    .unwrap_or(BAR_CHARS);
                format!(
                    "{:<22} [{}{}] {}/{}{rate}",
                    p.step.to_string(),
                    "#".repeat(filled as usize),
                    "-".repeat((BAR_CHARS - filled) as usize),
                    p.done,
                    total
                )
            }
            None => format!("{:<22} {} items{rate}", p.step.to_string(), p.done),
        };
        let mut err = std::io::stderr().lock();
        // Progress is best effort: a closed stderr must not stop a migration.
        let _ = if self.terminal {
            write!(err, "\r\x1b[2K{line}{end}")
        } else if !end.is_empty() {
            write!(err, "{line}{end}")
        } else {
            Ok(())
        };
        let _ = err.flush();
        self.drawn_at = Some(Instant::now());
    }
}
