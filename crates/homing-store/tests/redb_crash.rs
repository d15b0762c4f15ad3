//! Crash safety of the redb backend with group commit: a child process (this
//! test binary re-invoked with `HOMING_CRASH_CHILD` set) makes reservations
//! and releases them from several tasks, printing each acknowledged write;
//! the parent SIGKILLs it at a seeded random moment, reopens the files and
//! checks that every acknowledged write is there with its event, that the
//! event log is contiguous (seqs 1..=head, each change once, none without its
//! record change) and that the allocator continues above every unique ever
//! printed. Repeated for `KILLS` kill points on the same files.

use std::io::{BufRead, BufReader, Write};
use std::path::Path;
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use std::collections::HashSet;

use homing_core::{
    ActorId, DcId, DcRecord, EventKind, FencingToken, HostTime, Key, KeyName, LeasePolicy,
    RecordState, ReservationId, RunOutcome, StoreTime,
};
use homing_store::{
    Cas, DcStore, EVENTS_LIMIT_MAX, GlobalStore, RedbDcStore, RedbGlobalStore, RedbOptions,
    SetIfAbsent,
};

const CHILD_ENV: &str = "HOMING_CRASH_CHILD";
const SEED: u64 = 0x5eed_0fc0_ffee;
const KILLS: usize = 20;
const CHILD_TASKS: usize = 8;
const KILL_DELAY_MS_MIN: u64 = 40;
const KILL_DELAY_MS_SPAN: u64 = 400;
/// A child nobody kills stops by itself after this.
const CHILD_LIFETIME_MS_MAX: u64 = 30_000;

fn key_of(unique: u64) -> Key {
    Key::new(KeyName::new(format!("crash-{unique}")).unwrap())
}

fn id_of(unique: u64) -> ReservationId {
    ReservationId::new(DcId::new("iad").unwrap(), unique)
}

fn record(unique: u64) -> DcRecord {
    let actor = ActorId::new("10.0.0.1:9000").unwrap();
    let (at_host, at_store) = (HostTime::from_ms(0), StoreTime::from_ms(0));
    let policy = LeasePolicy::DEFAULT;
    DcRecord::reserve(
        id_of(unique),
        key_of(unique),
        None,
        FencingToken::FIRST,
        None,
        &homing_core::Holding {
            actor,
            lease: lease(),
            host_time: at_host,
            session: None,
        },
        at_store,
        &policy,
    )
    .0
}

/// xorshift64*: the kill schedule is the seed.
fn next(state: &mut u64) -> u64 {
    *state ^= *state >> 12;
    *state ^= *state << 25;
    *state ^= *state >> 27;
    state.wrapping_mul(0x2545_f491_4f6c_dd1d)
}

fn print_ack(what: &str, unique: u64) {
    let mut out = std::io::stdout().lock();
    writeln!(out, "{what} {unique}").unwrap();
    out.flush().unwrap();
}

/// The acknowledged creates and releases a child printed.
#[derive(Default)]
struct Acked {
    created: Vec<u64>,
    released: Vec<u64>,
}

impl Acked {
    fn parse(lines: impl Iterator<Item = String>) -> Acked {
        let mut acked = Acked::default();
        for line in lines {
            let Some((what, unique)) = line.split_once(' ') else {
                continue;
            };
            let Ok(unique) = unique.parse::<u64>() else {
                continue;
            };
            match what {
                "ack" => acked.created.push(unique),
                "rel" => acked.released.push(unique),
                _ => {}
            }
        }
        acked
    }
}

/// The event log after a kill: contiguous from 1, each change once, each
/// event's change in the records, every acknowledged change's event there.
async fn check_events(kill: usize, dc: &RedbDcStore, acked: &Acked) {
    let mut events = Vec::new();
    loop {
        let after = events.last().map_or(0, |e: &homing_core::Event| e.seq);
        let page = dc.events(after, EVENTS_LIMIT_MAX).await.unwrap();
        assert_eq!(page.oldest, 1, "kill {kill}: nothing trims this log");
        let full = page.events.len() == EVENTS_LIMIT_MAX;
        events.extend(page.events);
        if !full {
            let seqs: Vec<u64> = events.iter().map(|e| e.seq).collect();
            let want: Vec<u64> = (1..=page.head).collect();
            assert!(
                seqs == want,
                "kill {kill}: event seqs not 1..={}",
                page.head
            );
            break;
        }
    }
    let mut reserved = HashSet::new();
    let mut released = HashSet::new();
    for e in &events {
        let record = dc.get(&e.reservation).await.unwrap();
        let record =
            record.unwrap_or_else(|| panic!("kill {kill}: event {} without record", e.seq));
        let seen = match e.kind {
            EventKind::Reserved { .. } => &mut reserved,
            EventKind::Released { .. } => {
                assert!(
                    matches!(record.state, RecordState::Released { .. }),
                    "kill {kill}: release event {} without the release",
                    e.seq
                );
                &mut released
            }
            ref other => panic!("kill {kill}: unexpected event {}", other.name()),
        };
        assert!(
            seen.insert(e.reservation.unique()),
            "kill {kill}: event twice"
        );
    }
    for unique in &acked.created {
        assert!(
            reserved.contains(unique),
            "kill {kill}: reserve {unique} has no event"
        );
    }
    for unique in &acked.released {
        assert!(
            released.contains(unique),
            "kill {kill}: release {unique} has no event"
        );
    }
}

async fn child(dir: &Path) {
    let dc = Arc::new(RedbDcStore::open(dir.join("dc.redb"), RedbOptions::default()).unwrap());
    let global =
        Arc::new(RedbGlobalStore::open(dir.join("global.redb"), RedbOptions::default()).unwrap());
    let deadline = Instant::now() + Duration::from_millis(CHILD_LIFETIME_MS_MAX);
    let tasks: Vec<_> = (0..CHILD_TASKS)
        .map(|_| {
            let (dc, global) = (dc.clone(), global.clone());
            tokio::spawn(async move {
                while Instant::now() < deadline {
                    let unique = dc.allocate().await.unwrap();
                    let record = record(unique);
                    assert_eq!(
                        dc.compare_and_set(None, &record).await.unwrap(),
                        Cas::Written
                    );
                    let won = global.set_if_absent(&record.key, &record.id).await.unwrap();
                    assert_eq!(won, SetIfAbsent::Inserted);
                    print_ack("ack", unique);
                    if unique % 2 == 0 {
                        let released = record
                            .release(
                                record.token,
                                &lease(),
                                RunOutcome::Ok,
                                StoreTime::from_ms(1),
                            )
                            .next
                            .unwrap();
                        let cas = dc.compare_and_set(Some(1), &released).await.unwrap();
                        assert_eq!(cas, Cas::Written);
                        print_ack("rel", unique);
                    }
                }
            })
        })
        .collect();
    for t in tasks {
        t.await.unwrap();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn crash_child() {
    // Only does something when the crash test re-invokes this binary.
    if let Ok(dir) = std::env::var(CHILD_ENV) {
        child(Path::new(&dir)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redb_every_acknowledged_write_survives_sigkill_and_the_allocator_continues_above() {
    let dir = tempfile::tempdir().unwrap();
    let exe = std::env::current_exe().unwrap();
    let mut rng = SEED;
    let mut acked_all: Vec<u64> = Vec::new();
    println!("seed {SEED:#x}");
    for kill in 0..KILLS {
        let delay_ms = KILL_DELAY_MS_MIN + next(&mut rng) % KILL_DELAY_MS_SPAN;
        let mut child = Command::new(&exe)
            .args(["--exact", "crash_child", "--nocapture", "--test-threads=1"])
            .env(CHILD_ENV, dir.path())
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        let stdout = child.stdout.take().unwrap();
        let reader = std::thread::spawn(move || {
            Acked::parse(BufReader::new(stdout).lines().map_while(Result::ok))
        });
        tokio::time::sleep(Duration::from_millis(delay_ms)).await;
        child.kill().unwrap(); // SIGKILL on unix
        child.wait().unwrap();
        let acked = reader.join().unwrap();

        let dc = RedbDcStore::open(dir.path().join("dc.redb"), RedbOptions::default()).unwrap();
        let global =
            RedbGlobalStore::open(dir.path().join("global.redb"), RedbOptions::default()).unwrap();
        for &unique in &acked.created {
            let record = dc.get(&id_of(unique)).await.unwrap();
            assert!(
                record.is_some(),
                "kill {kill}: acknowledged record {unique} lost"
            );
            assert_eq!(
                global.get(&key_of(unique)).await.unwrap(),
                Some(id_of(unique)),
                "kill {kill}: entry {unique} lost"
            );
        }
        for &unique in &acked.released {
            let record = dc.get(&id_of(unique)).await.unwrap().unwrap();
            assert!(
                matches!(record.state, RecordState::Released { .. }),
                "kill {kill}: acknowledged release {unique} lost"
            );
        }
        check_events(kill, &dc, &acked).await;
        acked_all.extend(&acked.created);
        let max = acked_all.iter().copied().max().unwrap_or(0);
        let fresh = dc.allocate().await.unwrap();
        assert!(
            fresh > max,
            "kill {kill}: allocator handed out {fresh}, not above {max}"
        );
        println!(
            "kill {kill} after {delay_ms} ms: {} reserves and {} releases acknowledged, max {max}, next {fresh}",
            acked.created.len(),
            acked.released.len()
        );
    }
    assert!(
        acked_all.len() > KILLS,
        "the child made too little progress to test anything"
    );
}

/// The lease key of every holder here.
fn lease() -> homing_core::LeaseKey {
    homing_core::LeaseKey::from_bytes([1; 16]).expect("not all zeros")
}
