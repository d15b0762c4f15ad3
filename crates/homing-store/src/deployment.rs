//! The deployment version as the global store keeps it: the
//! [`Setting::DeploymentVersion`] setting. Every process speaks two
//! protocol versions (homing-core's `PROTOCOL_VERSION_OLDEST` and
//! `PROTOCOL_VERSION`), so a deployment upgrades one process at a time; a
//! feature that needs the newer version *everywhere* (a new stored form
//! that the previous release could not read) stays off until the
//! deployment version is raised to it, which `homing dc version --raise`
//! does only once every homingd listed in the DC directory speaks
//! it (as etcd raises its cluster version). It can be lowered again (a
//! rollback) until something was written in a form only the raised version
//! reads: the first writer of such a form notes it here first
//! ([`note_new_form_written`]). A homingd that speaks less than the
//! deployment version refuses to start.

use homing_core::wire::{PROTOCOL_VERSION, PROTOCOL_VERSION_OLDEST};
use serde::{Deserialize, Serialize};

use crate::error::StoreError;
use crate::global::{GlobalStore, read_setting, swap_setting_to};
use crate::setting::Setting;

/// The deployment version and whether it can still be lowered.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct DeploymentVersion {
    /// The protocol version every homingd of the deployment speaks, as last
    /// raised: features that need it are on.
    pub version: u16,
    /// Whether something was written in a form only `version` (or a
    /// version it was raised from) reads: the version can no longer be
    /// lowered. Kept across a later raise, which makes that raise final
    /// too: the flag does not say which version wrote, and lowering past
    /// it would make those records unreadable.
    pub new_form_written: bool,
}

impl Default for DeploymentVersion {
    /// A deployment whose version was never raised: the oldest version
    /// this build speaks, nothing written in a newer form.
    fn default() -> DeploymentVersion {
        DeploymentVersion {
            version: PROTOCOL_VERSION_OLDEST,
            new_form_written: false,
        }
    }
}

/// Why the deployment version was not changed.
#[derive(Debug, thiserror::Error)]
pub enum VersionChangeError {
    /// The store failed.
    #[error(transparent)]
    Store(#[from] StoreError),
    /// It is already at the newest version this build speaks.
    #[error("the deployment version is {0}, the newest this release speaks")]
    AtNewest(u16),
    /// It is already at the oldest version this build speaks.
    #[error("the deployment version is {0}, the oldest this release speaks")]
    AtOldest(u16),
    /// Something was written in the raised version's form.
    #[error(
        "the deployment version {0} cannot be lowered: something was written in a form only version {0} reads"
    )]
    NewFormWritten(u16),
    /// Another writer changed it meanwhile.
    #[error("the deployment version changed while it was being changed; read it again")]
    Raced,
}

/// The deployment version the store keeps (the default if never set).
pub async fn read(global: &dyn GlobalStore) -> Result<DeploymentVersion, StoreError> {
    Ok(read_setting(global, Setting::DeploymentVersion, WHAT)
        .await?
        .0)
}

/// Raises the deployment version by one, to at most this build's
/// `PROTOCOL_VERSION`; the version after. The caller checked that every
/// homingd speaks it.
pub async fn raise(global: &dyn GlobalStore) -> Result<DeploymentVersion, VersionChangeError> {
    change(global, |now| {
        if now.version >= PROTOCOL_VERSION {
            return Err(VersionChangeError::AtNewest(now.version));
        }
        Ok(DeploymentVersion {
            version: now.version + 1,
            new_form_written: now.new_form_written,
        })
    })
    .await
}

/// Lowers the deployment version by one (a rollback), unless something was
/// written in its form or it is at this build's oldest version; the
/// version after.
pub async fn lower(global: &dyn GlobalStore) -> Result<DeploymentVersion, VersionChangeError> {
    change(global, |now| {
        if now.new_form_written {
            return Err(VersionChangeError::NewFormWritten(now.version));
        }
        if now.version <= PROTOCOL_VERSION_OLDEST {
            return Err(VersionChangeError::AtOldest(now.version));
        }
        Ok(DeploymentVersion {
            version: now.version - 1,
            new_form_written: false,
        })
    })
    .await
}

/// Notes that something is about to be written in a form only `version`
/// reads (call before the first such write): from then on the version
/// cannot be lowered. Refused unless the deployment version is `version`.
pub async fn note_new_form_written(
    global: &dyn GlobalStore,
    version: u16,
) -> Result<DeploymentVersion, VersionChangeError> {
    change(global, |now| {
        if now.version != version {
            return Err(VersionChangeError::Raced);
        }
        Ok(DeploymentVersion {
            new_form_written: true,
            ..now
        })
    })
    .await
}

/// One compare-and-set from what the store holds to `next(held)`.
async fn change(
    global: &dyn GlobalStore,
    next: impl Fn(DeploymentVersion) -> Result<DeploymentVersion, VersionChangeError>,
) -> Result<DeploymentVersion, VersionChangeError> {
    let (now, held) = read_setting(global, Setting::DeploymentVersion, WHAT).await?;
    let after = next(now)?;
    if after == now && held.is_some() {
        return Ok(after);
    }
    match swap_setting_to(global, Setting::DeploymentVersion, held.as_deref(), &after).await? {
        Ok(()) => Ok(after),
        Err(_) => Err(VersionChangeError::Raced),
    }
}

/// What a version that does not decode is named in [`StoreError::Corrupt`].
const WHAT: &str = "deployment version";

#[cfg(test)]
mod tests {
    use super::*;
    use crate::memory::MemoryGlobalStore;

    #[tokio::test]
    async fn raised_lowered_until_a_new_form_is_written_and_bounded_by_what_this_build_speaks() {
        let global = MemoryGlobalStore::new();
        let never = read(&global).await.unwrap();
        assert_eq!(never.version, PROTOCOL_VERSION_OLDEST);
        assert!(matches!(
            lower(&global).await,
            Err(VersionChangeError::AtOldest(_))
        ));
        let raised = raise(&global).await.unwrap();
        assert_eq!(raised.version, PROTOCOL_VERSION_OLDEST + 1);
        assert_eq!(read(&global).await.unwrap(), raised);
        // A rollback before anything was written in the new form.
        assert_eq!(
            lower(&global).await.unwrap().version,
            PROTOCOL_VERSION_OLDEST
        );
        let mut newest = raise(&global).await.unwrap();
        while newest.version < PROTOCOL_VERSION {
            newest = raise(&global).await.unwrap();
        }
        assert!(matches!(
            raise(&global).await,
            Err(VersionChangeError::AtNewest(PROTOCOL_VERSION))
        ));
        assert!(matches!(
            note_new_form_written(&global, PROTOCOL_VERSION_OLDEST).await,
            Err(VersionChangeError::Raced)
        ));
        let written = note_new_form_written(&global, PROTOCOL_VERSION)
            .await
            .unwrap();
        assert!(written.new_form_written);
        assert!(matches!(
            lower(&global).await,
            Err(VersionChangeError::NewFormWritten(PROTOCOL_VERSION))
        ));
        assert_eq!(read(&global).await.unwrap(), written);
    }

    /// A form written at one version stays unreadable below it after a
    /// later raise: that raise cannot be rolled back either.
    #[tokio::test]
    async fn a_written_form_is_not_forgotten_by_a_later_raise() {
        let global = MemoryGlobalStore::new();
        let raised = raise(&global).await.unwrap();
        note_new_form_written(&global, raised.version)
            .await
            .unwrap();
        if raised.version < PROTOCOL_VERSION {
            let again = raise(&global).await.unwrap();
            assert!(again.new_form_written);
        }
        assert!(matches!(
            lower(&global).await,
            Err(VersionChangeError::NewFormWritten(_))
        ));
    }
}
