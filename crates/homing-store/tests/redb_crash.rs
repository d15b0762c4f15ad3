//! Crash safety of the redb backend with group commit: a child process (this
//! test binary re-invoked with `HOMING_CRASH_CHILD` set) makes reservations
//! from several tasks and prints each acknowledged one; the parent SIGKILLs it
//! at a seeded random moment, reopens the files and checks that every
//! acknowledged write is there and that the allocator continues above every
//! unique ever printed. Repeated for `KILLS` kill points on the same files.

use std::io::{BufRead, BufReader, Write};
use std::path::Path;
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use homing_core::{
    ActorId, DcId, DcRecord, FencingToken, HostTime, Key, KeyName, LeasePolicy, ReservationId,
    StoreTime,
};
use homing_store::{
    Cas, DcStore, GlobalStore, RedbDcStore, RedbGlobalStore, RedbOptions, SetIfAbsent,
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
        actor,
        at_host,
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
                    let mut out = std::io::stdout().lock();
                    writeln!(out, "ack {unique}").unwrap();
                    out.flush().unwrap();
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
            BufReader::new(stdout)
                .lines()
                .map_while(Result::ok)
                .filter_map(|l| l.strip_prefix("ack ").and_then(|u| u.parse::<u64>().ok()))
                .collect::<Vec<u64>>()
        });
        tokio::time::sleep(Duration::from_millis(delay_ms)).await;
        child.kill().unwrap(); // SIGKILL on unix
        child.wait().unwrap();
        let acked = reader.join().unwrap();

        let dc = RedbDcStore::open(dir.path().join("dc.redb"), RedbOptions::default()).unwrap();
        let global =
            RedbGlobalStore::open(dir.path().join("global.redb"), RedbOptions::default()).unwrap();
        for &unique in &acked {
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
        acked_all.extend(&acked);
        let max = acked_all.iter().copied().max().unwrap_or(0);
        let fresh = dc.allocate().await.unwrap();
        assert!(
            fresh > max,
            "kill {kill}: allocator handed out {fresh}, not above {max}"
        );
        println!(
            "kill {kill} after {delay_ms} ms: {} acknowledged, max {max}, next {fresh}",
            acked.len()
        );
    }
    assert!(
        acked_all.len() > KILLS,
        "the child made too little progress to test anything"
    );
}
