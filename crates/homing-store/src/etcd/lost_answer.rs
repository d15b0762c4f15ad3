//! Test only: a TCP relay in front of one etcd member that can stop passing
//! the member's answers back. A write sent through it lands and its answer
//! is lost: the ambiguous outcome a member that freezes or is cut off after
//! applying a write leaves its client with.

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::task::{JoinHandle, JoinSet};

/// Bytes one read of the member's answers takes.
const READ_BYTES_MAX: usize = 16 * 1024;

/// The relay; stops (with every connection through it) when dropped.
pub(crate) struct AnswerRelay {
    addr: SocketAddr,
    losing: Arc<AtomicBool>,
    lost: Arc<AtomicBool>,
    task: JoinHandle<()>,
}

impl AnswerRelay {
    /// A relay on loopback to the member at `endpoint` (`http://host:port`).
    pub(crate) async fn start(endpoint: &str) -> AnswerRelay {
        let target = endpoint
            .strip_prefix("http://")
            .expect("an http:// endpoint")
            .to_string();
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let addr = listener.local_addr().expect("bound");
        let losing = Arc::new(AtomicBool::new(false));
        let lost = Arc::new(AtomicBool::new(false));
        let (losing_in, lost_in) = (losing.clone(), lost.clone());
        let task = tokio::spawn(async move {
            // Dropped with the task: every connection ends with the relay.
            let mut connections = JoinSet::new();
            while let Ok((client, _)) = listener.accept().await {
                let Ok(member) = TcpStream::connect(&target).await else {
                    continue;
                };
                connections.spawn(relay(client, member, losing_in.clone(), lost_in.clone()));
            }
        });
        AnswerRelay {
            addr,
            losing,
            lost,
            task,
        }
    }

    /// The endpoint a client connects to instead of the member.
    pub(crate) fn endpoint(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// From now on, drop every byte the member sends back.
    pub(crate) fn lose_answers(&self) {
        self.losing.store(true, Ordering::SeqCst);
    }

    /// Whether any answer was dropped.
    pub(crate) fn lost_any(&self) -> bool {
        self.lost.load(Ordering::SeqCst)
    }
}

impl Drop for AnswerRelay {
    fn drop(&mut self) {
        self.task.abort();
    }
}

async fn relay(
    client: TcpStream,
    member: TcpStream,
    losing: Arc<AtomicBool>,
    lost: Arc<AtomicBool>,
) {
    let (mut client_read, mut client_write) = client.into_split();
    let (mut member_read, mut member_write) = member.into_split();
    let requests = async move {
        let _ = tokio::io::copy(&mut client_read, &mut member_write).await;
    };
    let answers = async move {
        let mut buf = vec![0u8; READ_BYTES_MAX];
        loop {
            let n = match member_read.read(&mut buf).await {
                Ok(0) | Err(_) => return,
                Ok(n) => n,
            };
            if losing.load(Ordering::SeqCst) {
                lost.store(true, Ordering::SeqCst);
                continue;
            }
            if client_write.write_all(&buf[..n]).await.is_err() {
                return;
            }
        }
    };
    tokio::join!(requests, answers);
}
