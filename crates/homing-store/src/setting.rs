//! Deployment settings: the few small values every DC and the CLI read
//! from the global store ([`GlobalStore::setting`]), each changed only by
//! compare-and-set ([`GlobalStore::swap_setting`]). Unlike global entries
//! and successions they change, so a reader may not cache one forever. The
//! store keeps a value as opaque bytes (whoever writes a setting encodes
//! it), at most [`SETTING_BYTES_MAX`], under the setting's
//! [`Setting::name`] in a keyspace of its own in every backend
//! (`keyspace::setting_key`).
//!
//! [`GlobalStore::setting`]: crate::GlobalStore::setting
//! [`GlobalStore::swap_setting`]: crate::GlobalStore::swap_setting

use std::fmt;

/// A deployment-wide setting kept in the global store: small values every DC
/// and the CLI read, changed only by compare-and-set.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Setting {
    /// Which homingd serve each DC, at which address (the DC directory peers and routers learn).
    Directory,
    /// The deployment-wide protocol version (raised when every homingd speaks it).
    DeploymentVersion,
}

impl Setting {
    /// Every setting, in [`Ord`] order: what a migration copies and
    /// verifies (a new setting joins this list, or it is not migrated).
    pub const ALL: [Setting; 2] = [Setting::Directory, Setting::DeploymentVersion];

    /// The setting's name, as stored (its key in every backend) and shown
    /// to operators: never renamed, since stored data is found by it.
    pub fn name(self) -> &'static str {
        match self {
            Setting::Directory => "directory",
            Setting::DeploymentVersion => "deployment-version",
        }
    }
}

impl fmt::Display for Setting {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// Largest value a setting may hold, in bytes: what every backend stores
/// in one key (etcd's default request limit is 1.5 MiB) and every reader
/// may hold in memory.
pub const SETTING_BYTES_MAX: usize = 64 * 1024;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn all_lists_every_setting_once_in_order_with_distinct_names() {
        let mut sorted = Setting::ALL;
        sorted.sort();
        assert_eq!(sorted, Setting::ALL);
        let names: std::collections::BTreeSet<&str> =
            Setting::ALL.iter().map(|s| s.name()).collect();
        assert_eq!(names.len(), Setting::ALL.len());
    }
}
