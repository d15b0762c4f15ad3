//! Shortcut notices owed to other DCs. After a move, the new tail's DC tells
//! the DC of the key's first reservation (homing-core's `ShortcutNotice`),
//! which records the new tail as the chain's shortcut: cold walks then skip
//! the links between. A notice the entry's DC did not answer (cut off,
//! restarting, suspect) is sent again, after 250 ms, then twice as long each
//! time up to 30 s, until that DC answers it — a lost notice would leave
//! every cold walk of the key one link longer until the key's next move.
//! A newer notice for the same entry supersedes one still owed. At most
//! [`NOTICES_OWED_MAX`] are owed at once (past that a notice is sent once,
//! logged). Owed notices live in memory: a homingd that stops drops them.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use homing_core::{ReservationId, ShortcutNotice};
use tokio::sync::watch;

use crate::peers::{PeerError, Peers};

/// Most notices owed (being sent again) at once.
pub const NOTICES_OWED_MAX: usize = 16_384;
/// Wait before a notice is sent again the first time.
const RETRY_MS_MIN: u64 = 250;
/// Longest wait between two sends of one notice.
const RETRY_MS_MAX: u64 = 30_000;

/// The notices owed, by entry: the token of the newest shortcut owed.
#[derive(Clone, Default)]
pub struct ShortcutNotices {
    owed: Arc<Mutex<HashMap<ReservationId, u64>>>,
}

impl ShortcutNotices {
    /// Tells `notice` to its entry's DC through `peers` in the background,
    /// again until that DC answers, a newer notice for the entry supersedes
    /// it, or `closing` turns true.
    pub fn tell(&self, notice: ShortcutNotice, peers: Peers, mut closing: watch::Receiver<bool>) {
        let owed = self.owe(&notice);
        let notices = self.clone();
        tokio::spawn(async move {
            let entry = notice.entry.clone();
            let token = notice.shortcut.token.get();
            let mut wait = RETRY_MS_MIN;
            loop {
                match peers.shortcut(notice.clone()).await {
                    Ok(noted) => {
                        tracing::debug!(entry = %entry, noted, "shortcut told");
                        break;
                    }
                    // An answer, if not the one asked for: again would not help.
                    Err(e @ (PeerError::Refused { .. } | PeerError::Lied { .. })) => {
                        tracing::info!(entry = %entry, error = %e, "shortcut refused");
                        break;
                    }
                    Err(e) if !owed => {
                        tracing::info!(entry = %entry, error = %e, owed_max = NOTICES_OWED_MAX,
                            "shortcut not told, and not sent again: too many notices owed");
                        return;
                    }
                    Err(e) => {
                        tracing::debug!(entry = %entry, error = %e, retry_ms = wait, "shortcut not told yet");
                    }
                }
                tokio::select! {
                    _ = tokio::time::sleep(Duration::from_millis(wait)) => {}
                    _ = closing.wait_for(|c| *c) => break,
                }
                if !notices.newest(&entry, token) {
                    return;
                }
                wait = (wait * 2).min(RETRY_MS_MAX);
            }
            if owed {
                notices.settle(&entry, token);
            }
        });
    }

    /// How many notices are owed now.
    pub fn owed(&self) -> usize {
        self.lock().len()
    }

    /// Records `notice` as owed (superseding an older one of its entry);
    /// whether it is (false: the table is full).
    fn owe(&self, notice: &ShortcutNotice) -> bool {
        let mut owed = self.lock();
        let token = notice.shortcut.token.get();
        if let Some(newest) = owed.get_mut(&notice.entry) {
            *newest = (*newest).max(token);
            return true;
        }
        if owed.len() >= NOTICES_OWED_MAX {
            return false;
        }
        owed.insert(notice.entry.clone(), token);
        true
    }

    /// Whether the notice of `token` is still the newest owed to `entry`.
    fn newest(&self, entry: &ReservationId, token: u64) -> bool {
        self.lock().get(entry) == Some(&token)
    }

    /// The notice of `token` was answered: nothing is owed to `entry`
    /// unless a newer one is.
    fn settle(&self, entry: &ReservationId, token: u64) {
        let mut owed = self.lock();
        if owed.get(entry) == Some(&token) {
            owed.remove(entry);
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<ReservationId, u64>> {
        // Every method changes the map in one step: a panic elsewhere while
        // it was locked left it consistent.
        self.owed
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }
}

#[cfg(test)]
mod tests {
    use homing_core::{FencingToken, Key, KeyName, Shortcut};

    use super::*;

    fn notice(entry: &str, token: u64) -> ShortcutNotice {
        ShortcutNotice {
            key: Key::new(KeyName::new("room-1").unwrap()),
            entry: entry.parse().unwrap(),
            shortcut: Shortcut {
                to: "fra.9".parse().unwrap(),
                token: FencingToken::new(token),
            },
        }
    }

    #[test]
    fn a_newer_notice_supersedes_an_older_one_and_only_the_newest_settles_its_entry() {
        let notices = ShortcutNotices::default();
        let entry: ReservationId = "iad.1".parse().unwrap();
        assert!(notices.owe(&notice("iad.1", 3)));
        assert!(notices.owe(&notice("iad.1", 5)));
        // A late older notice does not take the newest's place.
        assert!(notices.owe(&notice("iad.1", 4)));
        assert!(!notices.newest(&entry, 3) && notices.newest(&entry, 5));
        notices.settle(&entry, 3);
        assert_eq!(notices.owed(), 1);
        notices.settle(&entry, 5);
        assert_eq!(notices.owed(), 0);
    }

    #[test]
    fn past_the_bound_a_notice_of_a_new_entry_is_not_owed() {
        let notices = ShortcutNotices::default();
        for unique in 0..NOTICES_OWED_MAX as u64 {
            assert!(notices.owe(&notice(&format!("iad.{unique}"), 1)));
        }
        assert!(!notices.owe(&notice("sin.1", 1)));
        // An entry already owed is still superseded.
        assert!(notices.owe(&notice("iad.0", 2)));
        assert_eq!(notices.owed(), NOTICES_OWED_MAX);
    }
}
