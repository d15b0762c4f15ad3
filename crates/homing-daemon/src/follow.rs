//! homingd's driver of homing-node's [`LogFollower`]: reads the DC store's
//! event log every `log_follow_ms` (at once again after a full page), so
//! that the writes of every homingd sharing this DC's store wake this one's
//! waiters and watchers ([`Node::follow_log`]). A failing read is logged
//! once until the log is readable again.

use std::sync::Arc;
use std::time::Duration;

use homing_node::LogFollower;
use tokio::sync::watch;

use crate::node::Node;

/// Follows the log every `interval` until `shutdown` turns true.
pub async fn run(node: Arc<Node>, interval: Duration, mut shutdown: watch::Receiver<bool>) {
    let mut follower = LogFollower::new();
    let mut failing = false;
    loop {
        let more = match node.follow_log(&mut follower).await {
            Ok(more) => {
                if failing {
                    tracing::info!(dc = %node.dc(), "reading the dc store's event log again");
                }
                failing = false;
                more
            }
            Err(e) => {
                if !failing {
                    tracing::warn!(dc = %node.dc(), error = %e, "reading the dc store's event log failed: writes by other homingd of this dc wake nobody here until it answers (waiters still look again on their own timers)");
                }
                failing = true;
                false
            }
        };
        if more && !*shutdown.borrow() {
            continue;
        }
        tokio::select! {
            _ = tokio::time::sleep(interval) => {}
            _ = shutdown.changed() => return,
        }
    }
}
