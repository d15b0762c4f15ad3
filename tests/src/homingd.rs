//! A real `homingd` process: started from the binary the workspace built,
//! waited for until it prints its listening line, SIGKILLed on demand and
//! restarted on the same data directory and port. Killed when dropped, also
//! when a test panics.

use std::io::{BufRead, BufReader};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use homing_core::DcId;

/// The command that builds the binaries these tests run (`homing` for the
/// `homing hold` tests, `edge-router` and `actor-host` for the partition
/// test through real routers).
pub const BUILD_HOMINGD: &str = "cargo build -p homing-daemon -p homing-cli -p homing-edge \
     --features etcd --bin homingd --bin homing --bin edge-router --bin actor-host";
/// How long a daemon may take to print its listening line, in milliseconds.
pub const START_WAIT_MS_MAX: u64 = 20_000;

/// Where the `homingd` binary is: `$HOMINGD_BIN`, else next to this test
/// executable's `deps/` directory (`<target>/<profile>/homingd`). Panics with
/// the build command when it is missing.
pub fn homingd_binary() -> PathBuf {
    workspace_binary("homingd", "HOMINGD_BIN")
}

/// Where the `homing` CLI binary is: `$HOMING_BIN`, else beside `homingd`
/// (`<target>/<profile>/homing`). Panics with the build command when it is
/// missing.
pub fn homing_binary() -> PathBuf {
    workspace_binary("homing", "HOMING_BIN")
}

/// `$<env>` if set, else `<target>/<profile>/<name>` of this test executable.
pub(crate) fn workspace_binary(name: &str, env: &str) -> PathBuf {
    if let Some(path) = std::env::var_os(env) {
        return PathBuf::from(path);
    }
    let exe = std::env::current_exe().expect("the test executable has a path");
    // <target>/<profile>/deps/<test>-<hash> → <target>/<profile>/<name>
    let profile_dir = exe
        .parent()
        .and_then(Path::parent)
        .expect("test executables live in <target>/<profile>/deps");
    let binary = profile_dir.join(format!("{name}{}", std::env::consts::EXE_SUFFIX));
    assert!(
        binary.is_file(),
        "no {name} at {}: build it first with `{BUILD_HOMINGD}` (same CARGO_TARGET_DIR), \
         or set {env}",
        binary.display()
    );
    binary
}

/// The daemons' log filter: `$HOMING_E2E_LOG` (e.g. `info` to see every
/// request a failing test made), else `warn`.
pub fn daemon_log_filter() -> String {
    std::env::var("HOMING_E2E_LOG").unwrap_or_else(|_| "warn".to_string())
}

/// How to run one daemon.
#[derive(Debug, Clone)]
pub struct HomingdSpec {
    /// Its DC.
    pub dc: DcId,
    /// The QUIC address it binds (fixed, so a restart keeps it).
    pub listen: SocketAddr,
    /// Its data directory (the redb DC store).
    pub data_dir: PathBuf,
    /// Directory holding `ca.pem`, `node-<dc>.pem`, `node-<dc>.key`.
    pub certs_dir: PathBuf,
    /// Peer table: DC → the address this daemon uses for it (a relay).
    pub peers: Vec<(DcId, SocketAddr)>,
    /// Where the global store is.
    pub global: GlobalStoreSpec,
    /// Where this DC's records are.
    pub dc_store: DcStoreSpec,
    /// Further flags (lease policy, timeouts).
    pub extra_args: Vec<String>,
    /// File that collects the daemon's stderr across restarts.
    pub log: PathBuf,
    /// The `homingd` binary to run (`None`: this build's, [`homingd_binary`]),
    /// e.g. the previous release's in a mixed-version test.
    pub binary: Option<PathBuf>,
}

/// Where a daemon's global store lives.
#[derive(Debug, Clone)]
pub enum GlobalStoreSpec {
    /// A real etcd cluster.
    Etcd {
        /// Its client URLs.
        endpoints: Vec<String>,
        /// This deployment's key prefix in etcd.
        prefix: String,
    },
    /// redb in the daemon's data directory: a deployment of one DC, no etcd.
    Redb,
}

/// Where a daemon's DC store lives.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum DcStoreSpec {
    /// redb in the daemon's data directory.
    #[default]
    Redb,
    /// The etcd cluster of [`GlobalStoreSpec::Etcd`], under the same prefix.
    Etcd,
}

/// A running daemon; SIGKILLed on drop.
pub struct Homingd {
    spec: HomingdSpec,
    child: Option<Child>,
}

impl Homingd {
    /// Starts the daemon and waits for its listening line. Fails with the
    /// daemon's log when it exits or stays silent.
    pub async fn start(spec: HomingdSpec) -> Result<Homingd, String> {
        let mut daemon = Homingd { spec, child: None };
        daemon.spawn().await?;
        Ok(daemon)
    }

    async fn spawn(&mut self) -> Result<(), String> {
        let spec = &self.spec;
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&spec.log)
            .map_err(|e| format!("log file {}: {e}", spec.log.display()))?;
        let certs = &spec.certs_dir;
        let binary = spec.binary.clone().unwrap_or_else(homingd_binary);
        let mut command = Command::new(&binary);
        command
            .arg("--dc")
            .arg(spec.dc.as_str())
            .arg("--listen")
            .arg(spec.listen.to_string())
            .arg("--data-dir")
            .arg(&spec.data_dir)
            .arg("--ca-cert")
            .arg(certs.join("ca.pem"))
            .arg("--cert")
            .arg(certs.join(format!("node-{}.pem", spec.dc)))
            .arg("--key")
            .arg(certs.join(format!("node-{}.key", spec.dc)));
        match spec.dc_store {
            DcStoreSpec::Redb => command.args(["--dc-store", "redb"]),
            DcStoreSpec::Etcd => command.args(["--dc-store", "etcd"]),
        };
        match &spec.global {
            GlobalStoreSpec::Etcd { endpoints, prefix } => command
                .args(["--global-store", "etcd"])
                .arg("--etcd-endpoints")
                .arg(endpoints.join(","))
                .arg("--store-prefix")
                .arg(prefix),
            GlobalStoreSpec::Redb => command.args(["--global-store", "redb"]),
        };
        for (dc, addr) in &spec.peers {
            command.arg("--peer").arg(format!("{dc}={addr}"));
        }
        let mut child = command
            .args(&spec.extra_args)
            .env("HOMING_LOG", daemon_log_filter())
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(log)
            .spawn()
            .map_err(|e| format!("spawning {}: {e}", binary.display()))?;
        let stdout = child.stdout.take().expect("stdout was piped");
        self.child = Some(child);
        let line = tokio::task::spawn_blocking(move || {
            let (tx, rx) = std::sync::mpsc::channel();
            std::thread::spawn(move || {
                for line in BufReader::new(stdout).lines().map_while(Result::ok) {
                    if tx.send(line).is_err() {
                        break;
                    }
                }
            });
            rx.recv_timeout(Duration::from_millis(START_WAIT_MS_MAX))
        })
        .await
        .map_err(|e| e.to_string())?;
        match line {
            Ok(line) if line.contains("listening on") => Ok(()),
            other => {
                let log = std::fs::read_to_string(&self.spec.log).unwrap_or_default();
                Err(format!(
                    "homingd {} did not start ({other:?}); log:\n{log}",
                    self.spec.dc
                ))
            }
        }
    }

    /// How it runs.
    pub fn spec(&self) -> &HomingdSpec {
        &self.spec
    }

    /// Its DC.
    pub fn dc(&self) -> &DcId {
        &self.spec.dc
    }

    /// The address it serves on (not a relay).
    pub fn addr(&self) -> SocketAddr {
        self.spec.listen
    }

    /// The OS process id, while running.
    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(Child::id)
    }

    /// SIGKILL (`kill -9`): no shutdown, no flush beyond what was durable.
    pub fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            // Already exited: nothing to kill.
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// Its data directory.
    pub fn data_dir(&self) -> &std::path::Path {
        &self.spec.data_dir
    }

    /// Starts it again on the same port and data directory with `args`
    /// appended to its command line (this start and later ones).
    pub async fn restart_with(&mut self, args: &[&str]) -> Result<(), String> {
        self.spec
            .extra_args
            .extend(args.iter().map(|a| a.to_string()));
        self.restart().await
    }

    /// Stops it and starts `binary` (`None`: this build's) on the same
    /// port and data directory: an upgrade (or a rollback) of this DC.
    pub async fn restart_as(&mut self, binary: Option<PathBuf>) -> Result<(), String> {
        self.spec.binary = binary;
        self.restart().await
    }

    /// Starts it again on the same port and data directory.
    pub async fn restart(&mut self) -> Result<(), String> {
        self.kill();
        self.spawn().await
    }

    /// Everything it logged so far (for failure messages).
    pub fn log(&self) -> String {
        std::fs::read_to_string(&self.spec.log).unwrap_or_default()
    }
}

impl Drop for Homingd {
    fn drop(&mut self) {
        self.kill();
    }
}
