//! A throwaway 3-member etcd cluster on loopback whose members can be killed
//! one at a time (homing-store's `LocalEtcdCluster` cannot do that). Members
//! run the `etcd` binary from `PATH`; dropping the cluster kills every member
//! still running, also when a test panics.

use std::net::TcpListener;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use homing_core::{Key, KeyName};
use homing_store::GlobalStore;
use homing_store::etcd::EtcdGlobalStore;

/// Members of the cluster: a majority survives one kill.
pub const ETCD_MEMBERS: usize = 3;
/// How long to wait for the cluster to answer a quorum read, in milliseconds.
pub const ETCD_HEALTHY_WAIT_MS_MAX: u64 = 30_000;
const HEALTH_POLL_MS: u64 = 100;
const HEALTH_READ_TIMEOUT_MS: u64 = 1_000;

/// Why the cluster could not be started.
#[derive(Debug, thiserror::Error)]
pub enum EtcdError {
    /// No `etcd` on `PATH`: the caller skips with a printed reason.
    #[error("no etcd binary on PATH (apt-get install etcd-server)")]
    NoBinary,
    /// Starting or waiting for the members failed.
    #[error("etcd cluster failed to start: {0}")]
    Start(String),
}

/// Running etcd members; killed on drop.
pub struct EtcdCluster {
    members: Vec<Option<Child>>,
    endpoints: Vec<String>,
    dir: tempfile::TempDir,
}

fn free_tcp_port() -> Result<u16, EtcdError> {
    let listener = TcpListener::bind("127.0.0.1:0").map_err(|e| EtcdError::Start(e.to_string()))?;
    listener
        .local_addr()
        .map(|a| a.port())
        .map_err(|e| EtcdError::Start(e.to_string()))
}

fn etcd_binary() -> Option<PathBuf> {
    let path = std::env::var_os("PATH")?;
    std::env::split_paths(&path)
        .map(|dir| dir.join("etcd"))
        .find(|p| p.is_file())
}

impl EtcdCluster {
    /// Starts [`ETCD_MEMBERS`] members and waits (bounded) for a quorum read.
    pub async fn start() -> Result<EtcdCluster, EtcdError> {
        let binary = etcd_binary().ok_or(EtcdError::NoBinary)?;
        let dir = tempfile::tempdir().map_err(|e| EtcdError::Start(e.to_string()))?;
        let mut ports = Vec::with_capacity(ETCD_MEMBERS);
        for _ in 0..ETCD_MEMBERS {
            ports.push((free_tcp_port()?, free_tcp_port()?));
        }
        let initial: Vec<String> = ports
            .iter()
            .enumerate()
            .map(|(i, (_, peer))| format!("m{i}=http://127.0.0.1:{peer}"))
            .collect();
        let mut cluster = EtcdCluster {
            members: Vec::with_capacity(ETCD_MEMBERS),
            endpoints: ports
                .iter()
                .map(|(client, _)| format!("http://127.0.0.1:{client}"))
                .collect(),
            dir,
        };
        for (i, (client, peer)) in ports.iter().enumerate() {
            let data = cluster.dir.path().join(format!("m{i}"));
            let log = std::fs::File::create(cluster.dir.path().join(format!("m{i}.log")))
                .map_err(|e| EtcdError::Start(e.to_string()))?;
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
                .arg("--initial-cluster-token=homing-e2e")
                // Loopback: elect fast so a killed leader is replaced within a second.
                .arg("--heartbeat-interval=50")
                .arg("--election-timeout=500")
                .stdout(Stdio::null())
                .stderr(log)
                .spawn()
                .map_err(|e| EtcdError::Start(e.to_string()))?;
            cluster.members.push(Some(child));
        }
        cluster.wait_healthy().await?;
        Ok(cluster)
    }

    async fn wait_healthy(&self) -> Result<(), EtcdError> {
        let deadline = Instant::now() + Duration::from_millis(ETCD_HEALTHY_WAIT_MS_MAX);
        let probe = Key::new(KeyName::new("e2e-health").expect("a valid key name"));
        let mut last = String::new();
        while Instant::now() < deadline {
            let read = async {
                let store = EtcdGlobalStore::connect(&self.endpoints, "/e2e-health/").await?;
                store.get(&probe).await
            };
            match tokio::time::timeout(Duration::from_millis(HEALTH_READ_TIMEOUT_MS), read).await {
                Ok(Ok(_)) => return Ok(()),
                Ok(Err(e)) => last = e.to_string(),
                Err(_) => last = "quorum read timed out".to_string(),
            }
            tokio::time::sleep(Duration::from_millis(HEALTH_POLL_MS)).await;
        }
        Err(EtcdError::Start(format!(
            "not healthy after {ETCD_HEALTHY_WAIT_MS_MAX} ms: {last}"
        )))
    }

    /// Client URLs of every member (killed ones included: clients fail over).
    pub fn endpoints(&self) -> &[String] {
        &self.endpoints
    }

    /// SIGKILLs member `index` (0-based); the other two keep the quorum.
    pub fn kill_member(&mut self, index: usize) {
        if let Some(mut child) = self.members[index].take() {
            // Already exited: nothing left to kill.
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// How many members are still running.
    pub fn running_members(&self) -> usize {
        self.members.iter().filter(|m| m.is_some()).count()
    }
}

impl Drop for EtcdCluster {
    fn drop(&mut self) {
        for index in 0..self.members.len() {
            self.kill_member(index);
        }
    }
}
