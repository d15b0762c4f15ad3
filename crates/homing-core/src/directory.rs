//! The DC directory: which homingd serve each DC, at which address. Every
//! homingd lists its own address in the copy the global store keeps (a DC
//! served by several homingd is listed once per address); peers read it
//! from the store, routers ask a DC for it (the `Directory` request), so a
//! DC added while the deployment runs is reached without restarting anyone.
//!
//! A directory that arrives from the store or a peer is validated like any
//! other input: at most [`DIRECTORY_DCS_MAX`] DCs, each listed once with 1
//! to [`DIRECTORY_ADDRS_MAX`] distinct addresses, in DC order.

use std::net::SocketAddr;

use serde::{Deserialize, Serialize};
use thiserror::Error;

use crate::dc::DcId;

/// Most DCs a directory lists.
pub const DIRECTORY_DCS_MAX: usize = 256;
/// Most homingd addresses a directory lists for one DC.
pub const DIRECTORY_ADDRS_MAX: usize = 8;

/// Why a directory was refused.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum DirectoryError {
    /// More DCs than [`DIRECTORY_DCS_MAX`].
    #[error("a directory lists at most {DIRECTORY_DCS_MAX} dcs")]
    TooManyDcs,
    /// More addresses for one DC than [`DIRECTORY_ADDRS_MAX`].
    #[error("dc {0} would have more than {DIRECTORY_ADDRS_MAX} addresses")]
    TooManyAddrs(DcId),
    /// A DC listed with no address.
    #[error("dc {0} is listed with no address")]
    NoAddr(DcId),
    /// DCs out of order or listed twice.
    #[error("dc {0} is out of order or listed twice")]
    Unordered(DcId),
    /// One address listed twice for a DC.
    #[error("dc {dc} lists {addr} twice")]
    DuplicateAddr {
        /// The DC.
        dc: DcId,
        /// The address.
        addr: SocketAddr,
    },
}

/// One DC's homingd addresses.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct DirectoryDc {
    /// The DC.
    pub dc: DcId,
    /// Its homingd, in the order they were listed.
    pub addrs: Vec<SocketAddr>,
}

/// The DC directory (see the module doc): valid by construction.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(try_from = "Vec<DirectoryDc>", into = "Vec<DirectoryDc>")]
pub struct Directory {
    dcs: Vec<DirectoryDc>,
}

impl Directory {
    /// The directory of `dcs` if it keeps the rules of the module doc.
    pub fn new(dcs: Vec<DirectoryDc>) -> Result<Directory, DirectoryError> {
        if dcs.len() > DIRECTORY_DCS_MAX {
            return Err(DirectoryError::TooManyDcs);
        }
        for (i, entry) in dcs.iter().enumerate() {
            if i > 0 && dcs[i - 1].dc >= entry.dc {
                return Err(DirectoryError::Unordered(entry.dc.clone()));
            }
            if entry.addrs.is_empty() {
                return Err(DirectoryError::NoAddr(entry.dc.clone()));
            }
            if entry.addrs.len() > DIRECTORY_ADDRS_MAX {
                return Err(DirectoryError::TooManyAddrs(entry.dc.clone()));
            }
            for (j, addr) in entry.addrs.iter().enumerate() {
                if entry.addrs[..j].contains(addr) {
                    return Err(DirectoryError::DuplicateAddr {
                        dc: entry.dc.clone(),
                        addr: *addr,
                    });
                }
            }
        }
        Ok(Directory { dcs })
    }

    /// The DCs, in DC order.
    pub fn dcs(&self) -> &[DirectoryDc] {
        &self.dcs
    }

    /// Every (DC, address) pair, in DC order.
    pub fn addresses(&self) -> impl Iterator<Item = (&DcId, SocketAddr)> {
        self.dcs
            .iter()
            .flat_map(|entry| entry.addrs.iter().map(move |addr| (&entry.dc, *addr)))
    }

    /// Whether `addr` is listed for `dc`.
    pub fn lists(&self, dc: &DcId, addr: SocketAddr) -> bool {
        self.find(dc)
            .is_ok_and(|i| self.dcs[i].addrs.contains(&addr))
    }

    /// This directory with `addr` listed for `dc` (unchanged if it is).
    pub fn with(&self, dc: &DcId, addr: SocketAddr) -> Result<Directory, DirectoryError> {
        let mut dcs = self.dcs.clone();
        match self.find(dc) {
            Ok(i) if dcs[i].addrs.contains(&addr) => {}
            Ok(i) if dcs[i].addrs.len() >= DIRECTORY_ADDRS_MAX => {
                return Err(DirectoryError::TooManyAddrs(dc.clone()));
            }
            Ok(i) => dcs[i].addrs.push(addr),
            Err(_) if dcs.len() >= DIRECTORY_DCS_MAX => return Err(DirectoryError::TooManyDcs),
            Err(i) => dcs.insert(
                i,
                DirectoryDc {
                    dc: dc.clone(),
                    addrs: vec![addr],
                },
            ),
        }
        Ok(Directory { dcs })
    }

    /// This directory without `addr` for `dc` (`None`: without `dc` at
    /// all); a DC left with no address is left out.
    pub fn without(&self, dc: &DcId, addr: Option<SocketAddr>) -> Directory {
        let mut dcs = self.dcs.clone();
        if let Ok(i) = self.find(dc) {
            dcs[i].addrs.retain(|a| addr.is_some_and(|addr| *a != addr));
            if dcs[i].addrs.is_empty() {
                dcs.remove(i);
            }
        }
        Directory { dcs }
    }

    fn find(&self, dc: &DcId) -> Result<usize, usize> {
        self.dcs.binary_search_by(|entry| entry.dc.cmp(dc))
    }
}

impl TryFrom<Vec<DirectoryDc>> for Directory {
    type Error = DirectoryError;

    fn try_from(dcs: Vec<DirectoryDc>) -> Result<Directory, DirectoryError> {
        Directory::new(dcs)
    }
}

impl From<Directory> for Vec<DirectoryDc> {
    fn from(directory: Directory) -> Vec<DirectoryDc> {
        directory.dcs
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn dc(name: &str) -> DcId {
        name.parse().expect("valid dc")
    }

    fn addr(port: u16) -> SocketAddr {
        SocketAddr::from(([127, 0, 0, 1], port))
    }

    #[test]
    fn with_keeps_dcs_in_order_and_addresses_once() {
        let directory = Directory::default()
            .with(&dc("sin"), addr(3))
            .and_then(|d| d.with(&dc("fra"), addr(1)))
            .and_then(|d| d.with(&dc("fra"), addr(2)))
            .and_then(|d| d.with(&dc("fra"), addr(1)))
            .expect("within bounds");
        let listed: Vec<_> = directory
            .addresses()
            .map(|(dc, addr)| (dc.to_string(), addr.port()))
            .collect();
        let fra = || "fra".to_string();
        assert_eq!(listed, [(fra(), 1), (fra(), 2), ("sin".to_string(), 3)]);
        assert!(directory.lists(&dc("fra"), addr(2)));
        assert!(!directory.lists(&dc("sin"), addr(1)));
    }

    #[test]
    fn without_drops_an_address_and_a_dc_left_with_none() {
        let directory = Directory::default()
            .with(&dc("fra"), addr(1))
            .and_then(|d| d.with(&dc("fra"), addr(2)))
            .and_then(|d| d.with(&dc("sin"), addr(3)))
            .expect("within bounds");
        let fewer = directory.without(&dc("fra"), Some(addr(1)));
        assert!(!fewer.lists(&dc("fra"), addr(1)));
        assert!(fewer.lists(&dc("fra"), addr(2)));
        let no_sin = fewer.without(&dc("sin"), Some(addr(3)));
        assert_eq!(no_sin.dcs().len(), 1);
        assert_eq!(directory.without(&dc("fra"), None).dcs().len(), 1);
    }

    #[test]
    fn bounds_and_order_are_kept_on_every_way_in() {
        let mut full = Directory::default();
        for port in 0..DIRECTORY_ADDRS_MAX as u16 {
            full = full.with(&dc("fra"), addr(port)).expect("within bounds");
        }
        assert_eq!(
            full.with(&dc("fra"), addr(999)),
            Err(DirectoryError::TooManyAddrs(dc("fra")))
        );
        let entry = |name: &str, addrs: Vec<SocketAddr>| DirectoryDc {
            dc: dc(name),
            addrs,
        };
        let unordered = vec![entry("sin", vec![addr(1)]), entry("fra", vec![addr(2)])];
        assert_eq!(
            Directory::new(unordered),
            Err(DirectoryError::Unordered(dc("fra")))
        );
        let twice = vec![entry("fra", vec![addr(1), addr(1)])];
        assert!(matches!(
            Directory::new(twice),
            Err(DirectoryError::DuplicateAddr { .. })
        ));
        assert_eq!(
            Directory::new(vec![entry("fra", vec![])]),
            Err(DirectoryError::NoAddr(dc("fra")))
        );
        let bytes = postcard::to_allocvec(&vec![
            entry("sin", vec![addr(1)]),
            entry("fra", vec![addr(2)]),
        ])
        .expect("fits");
        assert!(postcard::from_bytes::<Directory>(&bytes).is_err());
    }
}
