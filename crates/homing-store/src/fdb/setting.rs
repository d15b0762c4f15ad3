//! Deployment settings in FoundationDB. **Verified by compilation, not
//! against a running cluster** (as the rest of the backend; see
//! [`crate::fdb`]).
//!
//! `setting/<keyspace::setting_key>` → the value as the caller gave it,
//! under the global prefix. A swap is ONE serializable transaction that
//! reads the key (taking its read conflict range), judges it against the
//! expected value and sets it: a swap of the same setting committed
//! between the read version and this commit fails it with a conflict, and
//! the retry judges again from what is there then. Run again after a
//! commit whose result is unknown, it may read the caller's own value
//! back: that swap was applied, by this call, answered as set.

use super::{Space, Step, TRANSACTION_ATTEMPTS_MAX, fdb_err};
use crate::error::StoreError;
use crate::global::judge_swap;
use crate::keyspace;
use crate::setting::Setting;

/// The section of settings: `setting/<keyspace::setting_key>`.
const SETTINGS: &[u8] = b"setting/";

/// The settings under one global prefix.
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

    /// The value of `name`, if it was ever set.
    pub(super) async fn get(&self, name: Setting) -> Result<Option<Vec<u8>>, StoreError> {
        let key = self.key(name);
        transact!(self.space, trx, {
            Ok(Step::Done(
                step!(trx.get(&key, false).await).map(|v| v.to_vec()),
            ))
        })
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
        let mut unknown = false;
        let judged = transact!(self.space, trx, unknown, {
            let held = step!(trx.get(&key, false).await).map(|v| v.to_vec());
            let judged = judge_swap(held, expected);
            if judged.is_ok() {
                trx.set(&key, value);
            }
            Ok(Step::Done(judged))
        })?;
        Ok(match judged {
            // A commit whose result was unknown landed: set once, by us.
            Err(Some(held)) if unknown && held == value => Ok(()),
            judged => judged,
        })
    }
}
