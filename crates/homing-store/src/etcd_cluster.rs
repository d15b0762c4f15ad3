//! A throwaway 3-member etcd cluster on loopback, for tests, the store
//! benchmark and the end-to-end suite (cargo feature `etcd`). Members run the
//! `etcd` binary from `PATH` with data in a temporary directory; a member can
//! be killed on its own (the other two keep the quorum) or frozen with
//! SIGSTOP (a GC pause, a stalled disk, a frozen VM: its connections stay
//! open and swallow requests) and resumed with SIGCONT; dropping the cluster
//! kills every member still running, also when a test panics.
//! [`LocalEtcdCluster::start_with`] picks the member count and extra flags
//! (a small `--quota-backend-bytes` for the compaction test).

use std::net::TcpListener;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// Members of the cluster.
pub const MEMBERS: usize = 3;
/// How long to wait for the cluster to accept a write, in milliseconds.
pub const HEALTHY_WAIT_MS_MAX: u64 = 30_000;
const HEALTH_POLL_MS: u64 = 100;

/// Why a cluster could not be started.
#[derive(Debug, thiserror::Error)]
pub enum ClusterError {
    /// No `etcd` binary on `PATH`: callers skip rather than fail.
    #[error("no etcd binary on PATH (apt-get install etcd-server)")]
    NoBinary,
    /// Starting or waiting for the members failed.
    #[error("etcd cluster failed to start: {0}")]
    Start(String),
}

/// Running members; killed on drop.
pub struct LocalEtcdCluster {
    members: Vec<Option<Child>>,
    endpoints: Vec<String>,
    _dir: tempfile::TempDir,
}

/// A TCP port on 127.0.0.1 that was free a moment ago and that this
/// process never handed out before: clusters started at the same time by
/// concurrent tests must not share a port (a member that cannot bind its
/// port dies, and its endpoint would then reach another test's cluster —
/// writes landing there were "lost" to this one's readers).
fn free_port() -> Result<u16, ClusterError> {
    static ISSUED: std::sync::Mutex<Vec<u16>> = std::sync::Mutex::new(Vec::new());
    let mut issued = ISSUED.lock().unwrap_or_else(|p| p.into_inner());
    // Hold every candidate until one is new, so the kernel offers others.
    let mut held = Vec::new();
    for _ in 0..64 {
        let listener =
            TcpListener::bind("127.0.0.1:0").map_err(|e| ClusterError::Start(e.to_string()))?;
        let port = listener
            .local_addr()
            .map_err(|e| ClusterError::Start(e.to_string()))?
            .port();
        if !issued.contains(&port) {
            issued.push(port);
            return Ok(port);
        }
        held.push(listener);
    }
    Err(ClusterError::Start(
        "no loopback port this process did not already hand out".to_string(),
    ))
}

/// A cluster token no other cluster of this machine uses: members of two
/// clusters never join each other, even at one another's ports.
fn cluster_token() -> String {
    static NEXT: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    let n = NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    format!("homing-test-{}-{n}", std::process::id())
}

fn etcd_binary() -> Option<PathBuf> {
    let path = std::env::var_os("PATH")?;
    std::env::split_paths(&path)
        .map(|dir| dir.join("etcd"))
        .find(|p| p.is_file())
}

impl LocalEtcdCluster {
    /// Starts the members and waits (bounded) until a write through the client succeeds.
    pub async fn start() -> Result<LocalEtcdCluster, ClusterError> {
        LocalEtcdCluster::start_with(MEMBERS, &[]).await
    }

    /// [`LocalEtcdCluster::start`] with `members` members (at least 1), each
    /// started with `args` besides the cluster's own (for example
    /// `--quota-backend-bytes=67108864`).
    pub async fn start_with(
        members: usize,
        args: &[&str],
    ) -> Result<LocalEtcdCluster, ClusterError> {
        assert!(members >= 1, "a cluster has at least one member");
        let binary = etcd_binary().ok_or(ClusterError::NoBinary)?;
        let dir = tempfile::tempdir().map_err(|e| ClusterError::Start(e.to_string()))?;
        let token = cluster_token();
        let mut ports = Vec::with_capacity(members);
        for _ in 0..members {
            ports.push((free_port()?, free_port()?));
        }
        let initial: Vec<String> = ports
            .iter()
            .enumerate()
            .map(|(i, (_, peer))| format!("m{i}=http://127.0.0.1:{peer}"))
            .collect();
        let mut cluster = LocalEtcdCluster {
            members: Vec::with_capacity(members),
            endpoints: ports
                .iter()
                .map(|(client, _)| format!("http://127.0.0.1:{client}"))
                .collect(),
            _dir: dir,
        };
        for (i, (client, peer)) in ports.iter().enumerate() {
            let data = cluster._dir.path().join(format!("m{i}"));
            let log = std::fs::File::create(cluster._dir.path().join(format!("m{i}.log")))
                .map_err(|e| ClusterError::Start(e.to_string()))?;
            let child = Command::new(&binary)
                .arg(format!("--name=m{i}"))
                .arg(format!("--data-dir={}", data.display()))
                .arg(format!("--listen-client-urls=http://127.0.0.1:{client}"))
                .arg(format!("--advertise-client-urls=http://127.0.0.1:{client}"))
                .arg(format!("--listen-peer-urls=http://127.0.0.1:{peer}"))
                .arg(format!(
                    "--initial-advertise-peer-urls=http://127.0.0.1:{peer}"
                ))
                .arg(format!("--initial-cluster={}", initial.join(",")))
                .arg("--initial-cluster-state=new")
                .arg(format!("--initial-cluster-token={token}"))
                // Loopback: elect fast so a killed leader is replaced within a second.
                .arg("--heartbeat-interval=50")
                .arg("--election-timeout=500")
                .args(args)
                .stdout(Stdio::null())
                .stderr(log)
                .spawn()
                .map_err(|e| ClusterError::Start(e.to_string()))?;
            cluster.members.push(Some(child));
        }
        cluster.wait_healthy().await?;
        Ok(cluster)
    }

    async fn wait_healthy(&self) -> Result<(), ClusterError> {
        let deadline = Instant::now() + Duration::from_millis(HEALTHY_WAIT_MS_MAX);
        let mut last = String::new();
        while Instant::now() < deadline {
            let options =
                etcd_client::ConnectOptions::new().with_timeout(Duration::from_millis(1_000));
            match etcd_client::Client::connect(&self.endpoints, Some(options)).await {
                Ok(mut client) => match client.put("/health", "ok", None).await {
                    Ok(_) => return Ok(()),
                    Err(e) => last = e.to_string(),
                },
                Err(e) => last = e.to_string(),
            }
            tokio::time::sleep(Duration::from_millis(HEALTH_POLL_MS)).await;
        }
        Err(ClusterError::Start(format!(
            "not healthy after {HEALTHY_WAIT_MS_MAX} ms: {last}"
        )))
    }

    /// Client URLs of every member (killed ones included: clients fail over).
    pub fn endpoints(&self) -> &[String] {
        &self.endpoints
    }

    /// SIGKILLs member `index` (0-based); the other two keep the quorum.
    pub fn kill_member(&mut self, index: usize) {
        if let Some(mut child) = self.members.get_mut(index).and_then(Option::take) {
            // Already exited: nothing left to kill.
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// SIGSTOPs member `index` (0-based): it stops answering but keeps its
    /// sockets open, so clients see silence, not a reset. Returns false if
    /// the member is not running.
    pub fn freeze_member(&self, index: usize) -> bool {
        self.signal_member(index, rustix::process::Signal::STOP)
    }

    /// SIGCONTs member `index` after [`LocalEtcdCluster::freeze_member`].
    pub fn thaw_member(&self, index: usize) -> bool {
        self.signal_member(index, rustix::process::Signal::CONT)
    }

    fn signal_member(&self, index: usize, signal: rustix::process::Signal) -> bool {
        let Some(Some(child)) = self.members.get(index) else {
            return false;
        };
        let pid = i32::try_from(child.id())
            .ok()
            .and_then(rustix::process::Pid::from_raw);
        pid.is_some_and(|pid| rustix::process::kill_process(pid, signal).is_ok())
    }

    /// The index of the member that leads the cluster now, as the first
    /// running member that answers a status request says (each member
    /// reports its own id and the leader's).
    pub async fn leader(&self) -> Result<usize, ClusterError> {
        let fail = |e: etcd_client::Error| ClusterError::Start(format!("etcd status: {e}"));
        let mut ids = vec![None; self.endpoints.len()];
        let mut leader = None;
        for (index, endpoint) in self.endpoints.iter().enumerate() {
            if self.members.get(index).is_none_or(Option::is_none) {
                continue;
            }
            let mut client = etcd_client::Client::connect([endpoint], None)
                .await
                .map_err(fail)?;
            let status = client.status().await.map_err(fail)?;
            ids[index] = status.header().map(|h| h.member_id());
            leader.get_or_insert(status.leader());
        }
        let leader = leader.ok_or_else(|| ClusterError::Start("no member runs".into()))?;
        ids.iter()
            .position(|id| *id == Some(leader))
            .ok_or_else(|| ClusterError::Start(format!("leader {leader:x} is no running member")))
    }

    /// How many members are still running.
    pub fn running_members(&self) -> usize {
        self.members.iter().filter(|m| m.is_some()).count()
    }
}

impl Drop for LocalEtcdCluster {
    fn drop(&mut self) {
        for index in 0..self.members.len() {
            self.kill_member(index);
        }
    }
}
