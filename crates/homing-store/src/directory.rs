//! The DC directory (homing-core's [`Directory`]) as the global store keeps
//! it: the [`Setting::Directory`] setting, holding the directory's postcard
//! bytes (the same bytes as on the wire), changed only by compare-and-set.
//! Every homingd lists its own address at start; the CLI shows and prunes
//! it (`homing dc directory`).

use homing_core::{Directory, DirectoryError};

use crate::error::StoreError;
use crate::global::{GlobalStore, decode_setting, read_setting, swap_setting_to};
use crate::setting::Setting;

/// Most compare-and-set attempts of one [`update`] before it gives up: each
/// lost attempt means another writer changed the directory meanwhile, and
/// homingd start rarely (the CLI more rarely still).
pub const UPDATE_ATTEMPTS_MAX: usize = 32;

/// The directory the global store keeps (empty if it was never set).
pub async fn read(global: &dyn GlobalStore) -> Result<Directory, StoreError> {
    Ok(read_setting(global, Setting::Directory, WHAT).await?.0)
}

/// Applies `change` to the directory the store keeps, by compare-and-set,
/// again on what another writer left if one changed it meanwhile; the
/// directory after (nothing is written when `change` leaves it as it was).
/// A change the directory's bounds refuse is
/// [`StoreError::InvalidArgument`].
pub async fn update(
    global: &dyn GlobalStore,
    change: impl Fn(&Directory) -> Result<Directory, DirectoryError>,
) -> Result<Directory, StoreError> {
    let (mut before, mut held) = read_setting(global, Setting::Directory, WHAT).await?;
    for _ in 0..UPDATE_ATTEMPTS_MAX {
        let after = change(&before).map_err(|e| StoreError::InvalidArgument(e.to_string()))?;
        if after == before && held.is_some() {
            return Ok(after);
        }
        match swap_setting_to(global, Setting::Directory, held.as_deref(), &after).await? {
            Ok(()) => return Ok(after),
            Err(found) => {
                // Another writer's directory: the change applies to it.
                before = decode_setting(found.as_deref(), WHAT)?;
                held = found;
            }
        }
    }
    Err(StoreError::Unavailable {
        backend: "global",
        reason: format!(
            "the dc directory changed under each of {UPDATE_ATTEMPTS_MAX} attempts to update it"
        ),
    })
}

/// What a directory that does not decode is named in [`StoreError::Corrupt`].
const WHAT: &str = "dc directory";

#[cfg(test)]
mod tests {
    use std::net::SocketAddr;

    use super::*;
    use crate::memory::MemoryGlobalStore;

    fn addr(port: u16) -> SocketAddr {
        SocketAddr::from(([127, 0, 0, 1], port))
    }

    #[tokio::test]
    async fn an_update_that_loses_to_another_writer_is_applied_on_what_that_one_left() {
        let global = MemoryGlobalStore::new();
        assert_eq!(read(&global).await.unwrap(), Directory::default());
        let dc = |name: &str| homing_core::DcId::new(name).unwrap();
        // While the first attempt computes its change, another homingd
        // lists itself: the first swap loses and the update runs again.
        let attempts = std::sync::atomic::AtomicUsize::new(0);
        let listed = update(&global, |d| {
            if attempts.fetch_add(1, std::sync::atomic::Ordering::SeqCst) == 0 {
                let other = homing_core::wire::encode(&d.with(&dc("fra"), addr(2))?).unwrap();
                let swapped = futures_now(global.swap_setting(Setting::Directory, None, &other));
                assert_eq!(swapped.unwrap(), Ok(()));
            }
            d.with(&dc("iad"), addr(1))
        })
        .await
        .unwrap();
        assert_eq!(attempts.into_inner(), 2);
        assert!(listed.lists(&dc("fra"), addr(2)) && listed.lists(&dc("iad"), addr(1)));
        assert_eq!(read(&global).await.unwrap(), listed);
        let unchanged = update(&global, |d| d.with(&dc("iad"), addr(1))).await;
        assert_eq!(unchanged.unwrap(), listed);
        let pruned = update(&global, |d| Ok(d.without(&dc("fra"), None)))
            .await
            .unwrap();
        assert_eq!(pruned.dcs().len(), 1);
        assert_eq!(read(&global).await.unwrap(), pruned);
    }

    #[tokio::test]
    async fn a_stored_directory_that_does_not_decode_is_corrupt() {
        let global = MemoryGlobalStore::new();
        global
            .swap_setting(Setting::Directory, None, &[0xff, 0xff])
            .await
            .unwrap()
            .unwrap();
        assert!(matches!(
            read(&global).await,
            Err(StoreError::Corrupt { .. })
        ));
    }

    /// Polls a future of the memory store, which never waits, once.
    fn futures_now<F: Future>(future: F) -> F::Output {
        let mut future = std::pin::pin!(future);
        let mut cx = std::task::Context::from_waker(std::task::Waker::noop());
        match future.as_mut().poll(&mut cx) {
            std::task::Poll::Ready(output) => output,
            std::task::Poll::Pending => panic!("the memory store does not wait"),
        }
    }
}
