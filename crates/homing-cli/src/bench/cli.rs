//! `homing bench cli`: what a script pays per `homing` call. `homing
//! resolve` of an absent key, run as a new process against one homingd on
//! loopback, beside the start of a process that does nothing (`true`),
//! medians of [`CALLS`] each in one run; and how homingd saw the calls'
//! connections end (each CLI closes its connection: a graceful close frees
//! it at once, an unsent one only at the idle timeout).

use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use homing_core::DcId;
use homing_daemon::{Devnet, DevnetOptions, Settings};

/// Calls of each program.
const CALLS: usize = 100;
/// Longest wait for homingd to count the last call's close.
const CLOSES_WAIT: Duration = Duration::from_secs(5);

/// Runs the suite; `false` if a call failed or a close was not graceful.
pub async fn run() -> anyhow::Result<bool> {
    let dc = DcId::new("dc0")?;
    let net = Devnet::start(DevnetOptions {
        dcs: vec![dc.clone()],
        latency_ms: 0,
        data_dir: None,
        overrides: Settings::default(),
    })
    .await?;
    let daemon = &net.dcs()[0].daemon;
    let metrics = daemon.metrics_addr().expect("a devnet serves metrics");
    let homing = std::env::current_exe()?;
    let dcs = format!("{dc}={}", daemon.local_addr());
    println!(
        "cli: {CALLS} calls of each, one after another, against one homingd on loopback; medians\n"
    );
    let graceful_before = graceful_closes(metrics).await?;
    let baseline = timed(CALLS, || Command::new("true"))?;
    let resolve = timed(CALLS, || {
        let mut command = Command::new(&homing);
        command
            .args(["resolve", "bench-absent-key"])
            .env("HOMING_CERTS", net.certs())
            .env("HOMING_DCS", &dcs)
            .env_remove("HOMING_LOG");
        command
    })?;
    // `resolve` of an absent key exits 3 (not found): an answer.
    let answered = resolve.codes.iter().all(|code| *code == Some(3));
    let deadline = Instant::now() + CLOSES_WAIT;
    let mut graceful = graceful_closes(metrics).await? - graceful_before;
    while graceful < CALLS as u64 && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(20)).await;
        graceful = graceful_closes(metrics).await? - graceful_before;
    }
    println!("| program | median ms | p90 ms |");
    println!("|---|---:|---:|");
    for (name, run) in [
        ("true (process start)", &baseline),
        ("homing resolve", &resolve),
    ] {
        println!(
            "| {name} | {:.1} | {:.1} |",
            run.quantile(0.5),
            run.quantile(0.9)
        );
    }
    println!(
        "\nhomingd counted {graceful} graceful closes for {CALLS} calls; every call answered: {answered}"
    );
    net.shutdown().await;
    Ok(answered && graceful >= CALLS as u64)
}

/// Wall times (ms) and exit codes of `calls` runs of `command()`.
struct Timed {
    ms: Vec<f64>,
    codes: Vec<Option<i32>>,
}

impl Timed {
    fn quantile(&self, q: f64) -> f64 {
        let mut sorted = self.ms.clone();
        sorted.sort_by(f64::total_cmp);
        sorted[((sorted.len() - 1) as f64 * q).round() as usize]
    }
}

fn timed(calls: usize, command: impl Fn() -> Command) -> anyhow::Result<Timed> {
    let mut timed = Timed {
        ms: Vec::with_capacity(calls),
        codes: Vec::with_capacity(calls),
    };
    for _ in 0..calls {
        let started = Instant::now();
        let status = command()
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status()?;
        timed.ms.push(started.elapsed().as_secs_f64() * 1000.0);
        timed.codes.push(status.code());
    }
    Ok(timed)
}

/// homingd's count of connections its callers closed gracefully, from its
/// `/metrics`.
async fn graceful_closes(metrics: std::net::SocketAddr) -> anyhow::Result<u64> {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut stream = tokio::net::TcpStream::connect(metrics).await?;
    let request = format!("GET /metrics HTTP/1.1\r\nhost: {metrics}\r\nconnection: close\r\n\r\n");
    stream.write_all(request.as_bytes()).await?;
    let mut text = String::new();
    stream.read_to_string(&mut text).await?;
    let line = text
        .lines()
        .find(|l| l.starts_with("homing_connection_closes_total{kind=\"graceful\"}"))
        .ok_or_else(|| anyhow::anyhow!("no graceful close count in /metrics"))?;
    let count = line.rsplit(' ').next().unwrap_or_default();
    Ok(count.parse()?)
}
