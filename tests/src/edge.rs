//! Real `edge-router` and `actor-host` processes next to a [`Cluster`]:
//! started from the binaries the workspace built, their output lines kept
//! with the instant each was read (so a test can wait on what a process
//! says, e.g. the router's `dc suspect` or the host's `stopped serving`),
//! and killed when dropped, also when a test panics. [`http_get`] is the
//! users' side: one request on a fresh connection.

use std::io::{BufRead, BufReader, Read};
use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use homing_core::DcId;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use crate::cluster::Cluster;
use crate::homingd::{START_WAIT_MS_MAX, workspace_binary};

/// Lines one process may keep; later lines are dropped (counted), so a
/// chatty process cannot grow a test's memory without bound.
pub const LINES_MAX: usize = 10_000;
/// Poll interval of [`Process::wait_for`], in milliseconds.
const POLL_MS: u64 = 5;
/// Largest response [`http_get`] reads, in bytes.
const RESPONSE_BYTES_MAX: u64 = 64 * 1024;

/// Where the `edge-router` binary is: `$EDGE_ROUTER_BIN`, else beside `homingd`.
pub fn edge_router_binary() -> PathBuf {
    workspace_binary("edge-router", "EDGE_ROUTER_BIN")
}

/// Where the `actor-host` binary is: `$ACTOR_HOST_BIN`, else beside `homingd`.
pub fn actor_host_binary() -> PathBuf {
    workspace_binary("actor-host", "ACTOR_HOST_BIN")
}

/// One line a process wrote, and when the test read it.
#[derive(Debug, Clone)]
pub struct Line {
    /// When the reader thread got it (at most a pipe's delay after it was written).
    pub at: Instant,
    /// The text, without the newline.
    pub text: String,
}

#[derive(Debug, Default)]
struct Lines {
    kept: Vec<Line>,
    dropped: usize,
}

/// A child process whose stdout and stderr lines are collected; SIGKILLed
/// on drop.
pub struct Process {
    name: String,
    child: Child,
    lines: Arc<Mutex<Lines>>,
}

impl Process {
    /// Spawns `command` (stdin closed, stdout and stderr collected).
    pub fn spawn(name: &str, mut command: Command) -> Result<Process, String> {
        let mut child = command
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .map_err(|e| format!("spawning {name}: {e}"))?;
        let lines = Arc::new(Mutex::new(Lines::default()));
        let stdout = child.stdout.take().expect("stdout was piped");
        let stderr = child.stderr.take().expect("stderr was piped");
        collect(stdout, lines.clone());
        collect(stderr, lines.clone());
        Ok(Process {
            name: name.to_string(),
            child,
            lines,
        })
    }

    /// The OS process id.
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// The first line containing `needle` read at or after `since`, if any.
    pub fn line_since(&self, needle: &str, since: Instant) -> Option<Line> {
        self.lines()
            .kept
            .iter()
            .find(|l| l.at >= since && l.text.contains(needle))
            .cloned()
    }

    /// How many lines so far contain `needle`.
    pub fn count(&self, needle: &str) -> usize {
        let lines = self.lines();
        lines
            .kept
            .iter()
            .filter(|l| l.text.contains(needle))
            .count()
    }

    /// Waits (polling, up to `timeout`) for a line containing `needle` read
    /// at or after `since`. Fails with everything the process said.
    pub async fn wait_for(
        &self,
        needle: &str,
        since: Instant,
        timeout: Duration,
    ) -> Result<Line, String> {
        let deadline = Instant::now() + timeout;
        loop {
            if let Some(line) = self.line_since(needle, since) {
                return Ok(line);
            }
            if Instant::now() >= deadline {
                return Err(format!(
                    "{} did not say {needle:?} within {timeout:?}; it said:\n{}",
                    self.name,
                    self.output()
                ));
            }
            tokio::time::sleep(Duration::from_millis(POLL_MS)).await;
        }
    }

    /// Whether it exited (reaps it if so).
    pub fn exited(&mut self) -> bool {
        matches!(self.child.try_wait(), Ok(Some(_)))
    }

    /// Everything it said so far (for failure messages).
    pub fn output(&self) -> String {
        let lines = self.lines();
        let mut out: String = lines.kept.iter().map(|l| format!("{}\n", l.text)).collect();
        if lines.dropped > 0 {
            out.push_str(&format!("({} more lines dropped)\n", lines.dropped));
        }
        out
    }

    fn lines(&self) -> std::sync::MutexGuard<'_, Lines> {
        // A reader thread that panicked left whole lines behind: keep them.
        self.lines.lock().unwrap_or_else(|p| p.into_inner())
    }
}

impl Drop for Process {
    fn drop(&mut self) {
        // Already exited: nothing to kill.
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Reads `from` line by line into `lines` on a thread of its own, until EOF.
fn collect(from: impl Read + Send + 'static, lines: Arc<Mutex<Lines>>) {
    std::thread::spawn(move || {
        for text in BufReader::new(from).lines().map_while(Result::ok) {
            let line = Line {
                at: Instant::now(),
                text,
            };
            let mut lines = lines.lock().unwrap_or_else(|p| p.into_inner());
            if lines.kept.len() < LINES_MAX {
                lines.kept.push(line);
            } else {
                lines.dropped += 1;
            }
        }
    });
}

/// The text after `prefix` in the first line starting with it, once the
/// process said it (within [`START_WAIT_MS_MAX`]).
async fn started_line(process: &Process, prefix: &str, since: Instant) -> Result<String, String> {
    let line = process
        .wait_for(prefix, since, Duration::from_millis(START_WAIT_MS_MAX))
        .await?;
    line.text
        .split_once(prefix)
        .map(|(_, rest)| rest.to_string())
        .ok_or_else(|| format!("{}: {:?} is not {prefix}…", process.name, line.text))
}

/// A running `edge-router` on a loopback port.
pub struct EdgeRouterProcess {
    /// The process (its log: WARN `dc suspect`, INFO `dc answers again`).
    pub process: Process,
    /// Where it accepts HTTP.
    pub addr: SocketAddr,
    /// Where it serves /metrics, /healthz and /readyz (started with
    /// `--metrics-listen=ADDR`).
    pub metrics: Option<SocketAddr>,
}

impl EdgeRouterProcess {
    /// Starts `edge-router` with the router certificate of `cluster`, the
    /// DC table `order` (nearest first, each reached directly) and
    /// `extra_args`; waits for its listening line. Logs the resolver's
    /// transitions (`homing_client::resolver=info`), as by default.
    pub async fn start(
        cluster: &Cluster,
        order: &[&DcId],
        extra_args: &[&str],
    ) -> Result<EdgeRouterProcess, String> {
        let mut command = Command::new(edge_router_binary());
        command
            .args(["--listen", "127.0.0.1:0", "--certs"])
            .arg(cluster.dir().join("certs"));
        for dc in order {
            command
                .arg("--dc")
                .arg(format!("{dc}={}", cluster.addr(dc)));
        }
        command
            .args(extra_args)
            .env("HOMING_LOG", "warn,homing_client::resolver=info")
            .env("NO_COLOR", "1");
        let since = Instant::now();
        let process = Process::spawn("edge-router", command)?;
        let url = started_line(&process, "edge-router listening on http://", since).await?;
        let addr = url
            .trim()
            .parse()
            .map_err(|e| format!("edge-router address {url:?}: {e}"))?;
        let mut metrics = None;
        if extra_args.iter().any(|a| a.starts_with("--metrics-listen")) {
            let url = started_line(&process, "edge-router metrics on http://", since).await?;
            let at = url.trim().trim_end_matches("/metrics");
            let at = at
                .parse()
                .map_err(|e| format!("edge-router metrics address {url:?}: {e}"))?;
            metrics = Some(at);
        }
        Ok(EdgeRouterProcess {
            process,
            addr,
            metrics,
        })
    }
}

/// A running `actor-host` holding a key from one DC.
pub struct ActorHostProcess {
    /// The process (stdout: `actor-host serving …`, `actor-host stopped
    /// serving …`; its HostAgent logs `lease renewed` at debug).
    pub process: Process,
    /// Its actor id: the address it serves on.
    pub actor: String,
}

impl ActorHostProcess {
    /// Starts `actor-host KEY` with the host certificate of `dc`, acquiring
    /// from `dc` directly; waits until it serves. Its HostAgent logs each
    /// renewal (`lease renewed`).
    pub async fn start(
        cluster: &Cluster,
        dc: &DcId,
        key: &str,
    ) -> Result<ActorHostProcess, String> {
        let mut command = Command::new(actor_host_binary());
        command
            .arg(key)
            .arg("--dc")
            .arg(format!("{dc}={}", cluster.addr(dc)))
            .arg("--certs")
            .arg(cluster.dir().join("certs"))
            .env("HOMING_LOG", "warn,homing_client::host_agent=debug")
            .env("NO_COLOR", "1");
        let since = Instant::now();
        let process = Process::spawn("actor-host", command)?;
        // "actor-host serving KEY on http://ADDR under RES (token N)"
        let rest = started_line(&process, "actor-host serving ", since).await?;
        let actor = rest
            .split_once(" on http://")
            .and_then(|(_, rest)| rest.split_whitespace().next())
            .ok_or_else(|| format!("actor-host: no address in {rest:?}"))?
            .to_string();
        Ok(ActorHostProcess { process, actor })
    }
}

/// What [`http_get`] got: the status and the body (framing left in, as
/// read; fine for a substring check).
#[derive(Debug, Clone)]
pub struct HttpAnswer {
    /// The status code.
    pub status: u16,
    /// Everything after the header block.
    pub body: String,
}

/// `GET path` to `addr` over HTTP/1.1 on a fresh connection
/// (`connection: close`), read to its end within `timeout`. Errors are the
/// reason, as text.
pub async fn http_get(
    addr: SocketAddr,
    path: &str,
    timeout: Duration,
) -> Result<HttpAnswer, String> {
    let exchange = async {
        let mut stream = tokio::net::TcpStream::connect(addr).await?;
        let request = format!("GET {path} HTTP/1.1\r\nhost: {addr}\r\nconnection: close\r\n\r\n");
        stream.write_all(request.as_bytes()).await?;
        let mut bytes = Vec::new();
        stream
            .take(RESPONSE_BYTES_MAX)
            .read_to_end(&mut bytes)
            .await?;
        Ok::<_, std::io::Error>(bytes)
    };
    let bytes = tokio::time::timeout(timeout, exchange)
        .await
        .map_err(|_| format!("GET {path} from {addr}: no answer within {timeout:?}"))?
        .map_err(|e| format!("GET {path} from {addr}: {e}"))?;
    let text = String::from_utf8_lossy(&bytes);
    let status = text
        .strip_prefix("HTTP/1.1 ")
        .and_then(|rest| rest.get(..3))
        .and_then(|code| code.parse().ok())
        .ok_or_else(|| format!("GET {path} from {addr}: not an HTTP/1.1 response: {text:?}"))?;
    let body = text
        .split_once("\r\n\r\n")
        .map_or_else(String::new, |(_, body)| body.to_string());
    Ok(HttpAnswer { status, body })
}
