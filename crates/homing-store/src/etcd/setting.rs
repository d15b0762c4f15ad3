//! Deployment settings in etcd: `setting/<keyspace::setting_key>` → the
//! value as the caller gave it, under the global prefix.
//!
//! - `setting`: a linearizable get.
//! - `swap_setting`: ONE transaction, `value(setting/n) == expected` (or
//!   `create_revision(setting/n) == 0` when the caller expects it never
//!   set; a value compare on an absent key fails in etcd) ? put : get. If
//!   an abandoned attempt may have landed (`members::Answer::ambiguous`)
//!   and the failed guard reads the caller's own value back, the swap was
//!   applied once, by this call: answered as set. An attempt that lands
//!   late, after a retry that succeeded, fails its guard unless the
//!   setting holds `expected` again then (an A-B-A change): it then sets
//!   `value` a second time, which a compare on the value cannot tell
//!   apart. Settings are written rarely, by operators and rollouts.

use etcd_client::{Compare, CompareOp, Txn, TxnOp};

use super::members::Op;
use super::{Space, first_kv};
use crate::error::StoreError;
use crate::keyspace;
use crate::setting::Setting;

/// The section of settings: `setting/<keyspace::setting_key>`.
const SETTINGS: &[u8] = b"setting/";

/// The settings under one global prefix.
#[derive(Clone)]
pub(super) struct Settings {
    space: Space,
}

impl Settings {
    pub(super) fn new(space: Space) -> Settings {
        Settings { space }
    }

    fn key(&self, name: Setting) -> Vec<u8> {
        self.space.key(SETTINGS, keyspace::setting_key(name))
    }

    /// The value of `name`, if it was ever set (a linearizable read).
    pub(super) async fn get(&self, name: Setting) -> Result<Option<Vec<u8>>, StoreError> {
        let response = self.space.get(Op::HotRead, self.key(name), None).await?;
        Ok(response.kvs().first().map(|kv| kv.value().to_vec()))
    }

    /// The compare-and-set of `name` (see the module doc); the value is
    /// checked against its bound by the caller.
    pub(super) async fn swap(
        &self,
        name: Setting,
        expected: Option<&[u8]>,
        value: &[u8],
    ) -> Result<Result<(), Option<Vec<u8>>>, StoreError> {
        let key = self.key(name);
        let guard = match expected {
            Some(expected) => Compare::value(key.clone(), CompareOp::Equal, expected),
            None => Compare::create_revision(key.clone(), CompareOp::Equal, 0),
        };
        let txn = Txn::new()
            .when([guard])
            .and_then([TxnOp::put(key.clone(), value, None)])
            .or_else([TxnOp::get(key, None)]);
        let seen = self.space.members.revision_seen();
        let txned = self.space.txn_at(Op::HotWrite, txn).await?;
        if txned.succeeded {
            return Ok(Ok(()));
        }
        let kv = first_kv(txned.responses.first())?;
        let members = &self.space.members;
        if let Some(kv) = &kv
            && kv.value() == value
            && members.landed_ours(txned.ambiguous, seen, kv)
        {
            // An abandoned attempt of this call landed: set once, by us.
            return Ok(Ok(()));
        }
        Ok(Err(kv.map(|kv| kv.value().to_vec())))
    }
}
