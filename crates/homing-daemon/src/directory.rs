//! homingd's side of the DC directory (homing-store's `directory`): it
//! lists its own address in the global store's copy, then reads the copy
//! every `directory_refresh_ms` and hands it to its node ([`Node::learn_directory`]):
//! DCs and homingd it did not know become peers, and routers asking for the
//! directory get this copy. A DC added to the deployment is thus a peer of
//! every running DC, and reached by every running router, within about two
//! refresh intervals, with no restart. A failing read or listing is logged
//! once until it succeeds, and retried at the next interval.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use homing_store::directory;
use tokio::sync::watch;

use crate::node::Node;

/// Lists `advertise` (if any) for this DC, then reads the directory at
/// once and every `interval` after, until `shutdown` turns true.
pub async fn run(
    node: Arc<Node>,
    advertise: Option<SocketAddr>,
    interval: Duration,
    mut shutdown: watch::Receiver<bool>,
) {
    let mut listed = advertise.is_none();
    let mut failing = false;
    loop {
        let round = round(&node, advertise, &mut listed).await;
        match round {
            Ok(()) if failing => {
                tracing::info!(dc = %node.dc(), "the dc directory is read again");
                failing = false;
            }
            Ok(()) => {}
            Err(e) if !failing => {
                tracing::warn!(dc = %node.dc(), error = %e, "the dc directory could not be read or written: dcs added meanwhile are not learned until it can");
                failing = true;
            }
            Err(_) => {}
        }
        tokio::select! {
            _ = tokio::time::sleep(interval) => {}
            _ = shutdown.wait_for(|stop| *stop) => return,
        }
    }
}

/// One round: list this homingd if it is not yet, then read and learn.
async fn round(
    node: &Node,
    advertise: Option<SocketAddr>,
    listed: &mut bool,
) -> Result<(), homing_store::StoreError> {
    let global = node.global().as_ref();
    if let (false, Some(addr)) = (*listed, advertise) {
        let dc = node.dc();
        directory::update(global, |d| d.with(dc, addr)).await?;
        tracing::info!(dc = %dc, %addr, "listed in the dc directory");
        *listed = true;
    }
    node.learn_directory(directory::read(global).await?);
    Ok(())
}
