//! The one conformance suite every [`GlobalStore`] and [`DcStore`] backend
//! must pass. A backend provides a [`Backend`] (how to open a store at a
//! named place); [`conformance_tests!`](crate::conformance_tests) turns the
//! suite into one `#[tokio::test]` per case, and [`run_all`] runs every case
//! in sequence (for backends that need one expensive fixture, like an etcd
//! cluster). Enabled under `cfg(test)` and by the `conformance` feature.
//!
//! The cases live by trait: `global` (write-once entries), `dc_lease`,
//! `succession` and `setting` (the [`GlobalStore`]'s DC leases,
//! successions and deployment settings), `dc` ([`DcStore`]) and `session`
//! (the [`DcStore`]'s host sessions); each is re-exported here, where [`run_all`] and
//! [`conformance_tests!`](crate::conformance_tests) find it by name. This
//! module holds the harness: [`Backend`], the fixtures every file shares,
//! and the one list of cases.

use std::sync::Arc;

use async_trait::async_trait;
use homing_core::{
    ActorId, DcRecord, FencingToken, HostTime, Key, KeyName, LeaseKey, LeasePolicy, Namespace,
    ReservationId, StoreTime,
};

use crate::dc::DcStore;
use crate::global::GlobalStore;

mod dc;
mod dc_lease;
mod global;
mod session;
mod setting;
mod succession;

pub use self::dc::{
    EVENT_WRITERS, dc_allocator_floor_bounds_uniques_and_raise_skips_past,
    dc_cas_create_when_exists_fails, dc_cas_creates_then_updates, dc_cas_rejects_caller_bugs,
    dc_cas_with_stale_version_fails_and_changes_nothing, dc_concurrent_allocations_are_unique,
    dc_concurrent_cas_has_exactly_one_winner, dc_concurrent_writes_get_contiguous_event_seqs,
    dc_due_lists_exactly_what_is_due_and_follows_writes,
    dc_events_record_every_change_of_holder_and_nothing_else, dc_events_survive_reopen,
    dc_identical_concurrent_writes_land_once,
    dc_import_copies_records_and_events_without_overwriting,
    dc_keys_created_counts_first_reservations_per_namespace, dc_max_length_record_round_trips,
    dc_migration_mark_is_kept_until_cleared, dc_reopen_keeps_records_and_allocator_continues_above,
    dc_scan_orders_filters_and_pages, dc_scan_page_is_full_unless_last,
    dc_scan_scopes_cover_exactly_their_namespaces, max_length_record,
};
pub use self::dc_lease::{
    global_dc_lease_lapses_then_expires_without_renewals,
    global_dc_lease_renews_and_keeps_the_highest_marks, global_dc_retired_is_refused_for_good,
};
pub use self::global::{
    global_concurrent_set_if_absent_has_exactly_one_winner,
    global_get_many_keeps_order_and_bounds_the_batch,
    global_nearest_read_is_never_wrong_and_catches_up, global_scan_pages_in_key_order,
    global_unicode_and_long_keys_do_not_collide, global_write_once,
    global_write_once_whose_answer_was_lost_is_inserted_once,
};
pub use self::session::{
    dc_concurrent_session_renewals_have_exactly_one_winner,
    dc_due_sessions_follow_renewals_ends_and_deletes,
    dc_import_session_copies_rows_without_overwriting,
    dc_records_join_and_freeze_only_under_their_sessions_guard,
    dc_session_keys_and_notices_follow_every_write, dc_session_rows_change_only_by_compare_and_set,
    dc_sessions_page_every_row_in_name_order,
};
pub use self::setting::{
    global_concurrent_setting_swaps_have_exactly_one_winner,
    global_setting_above_its_bound_is_refused, global_setting_is_changed_only_by_a_matching_swap,
    global_setting_swap_whose_answer_was_lost_is_set_once,
    global_settings_are_independent_of_each_other_and_of_entries,
};
pub use self::succession::{
    global_an_import_losing_its_answer_finds_a_succession_already_there,
    global_concurrent_successions_have_exactly_one_winner,
    global_import_and_serving_successions_exclude_each_other,
    global_import_succession_is_write_once_for_either_cause,
    global_scan_successions_lists_every_dc_in_order,
    global_set_successor_whose_answer_was_lost_is_written_once,
    global_successions_of_pages_in_unique_order,
    global_successor_is_write_once_and_checks_its_cause,
    global_take_over_waits_for_the_dc_lease_to_expire,
    global_takeovers_racing_a_renewal_are_refused_or_reconciled,
};

/// Concurrent tasks in the race cases.
pub const RACERS: usize = 32;

/// How the suite opens stores of one backend.
#[async_trait]
pub trait Backend: Send + Sync {
    /// The global store at `place`; empty the first time a place is opened.
    async fn global_store(&self, place: &str) -> Arc<dyn GlobalStore>;
    /// The DC store at `place`; empty the first time a place is opened. The
    /// suite drops every handle before opening a place again.
    async fn dc_store(&self, place: &str) -> Arc<dyn DcStore>;
    /// Whether reopening a place finds what was written there.
    fn durable(&self) -> bool;
    /// A global store at `place` whose next write (`set_if_absent`,
    /// `set_successor`, `swap_setting`) is applied but whose answer is lost
    /// on the way back (its transport drops it), so the
    /// store itself must resolve the ambiguous outcome; `None` (the case is
    /// skipped) where a write's answer cannot be lost: a local call (memory,
    /// redb) or a client that resolves it out of our sight (FoundationDB).
    async fn global_store_losing_next_answer(&self, _place: &str) -> Option<AnswerLost> {
        None
    }
}

/// A global store whose next write's answer is lost, from
/// [`Backend::global_store_losing_next_answer`].
pub struct AnswerLost {
    /// The store.
    pub store: Arc<dyn GlobalStore>,
    /// Whether an answer was in fact lost (keeps whatever loses it alive).
    pub lost: Box<dyn Fn() -> bool + Send + Sync>,
}

fn key(ns: &str, name: &str) -> Key {
    Key::in_namespace(
        Namespace::new(ns).expect("valid namespace"),
        KeyName::new(name).expect("valid name"),
    )
}

fn rid(text: &str) -> ReservationId {
    text.parse().expect("valid reservation id")
}

/// The lease key of the holder of every record these cases make.
pub fn lease() -> LeaseKey {
    LeaseKey::from_bytes([1; 16]).expect("not all zeros")
}

/// A fresh version-1 record of `id` for `key`, held under [`lease`].
pub fn record(id: &ReservationId, key: &Key) -> DcRecord {
    DcRecord::reserve(
        id.clone(),
        key.clone(),
        None,
        FencingToken::FIRST,
        None,
        &homing_core::Holding {
            actor: ActorId::new("10.0.0.1:9000").expect("valid actor"),
            lease: lease(),
            host_time: HostTime::from_ms(0),
            session: None,
        },
        StoreTime::from_ms(0),
        &LeasePolicy::DEFAULT,
    )
    .0
}

/// The conformance cases, listed once: `conformance_cases!((m) { args })`
/// calls `m!` with `args`, then every case's name. [`run_all`] and [`conformance_tests!`]
/// both take their list from here, so a case added here runs everywhere.
#[macro_export]
#[doc(hidden)]
macro_rules! conformance_cases {
    (($($callback:tt)+) { $($args:tt)* }) => {
        $($callback)+! { $($args)*
        global_write_once,
        global_write_once_whose_answer_was_lost_is_inserted_once,
        global_nearest_read_is_never_wrong_and_catches_up,
        global_concurrent_set_if_absent_has_exactly_one_winner,
        global_get_many_keeps_order_and_bounds_the_batch,
        global_unicode_and_long_keys_do_not_collide,
        dc_cas_creates_then_updates,
        dc_cas_with_stale_version_fails_and_changes_nothing,
        dc_cas_create_when_exists_fails,
        dc_cas_rejects_caller_bugs,
        dc_concurrent_cas_has_exactly_one_winner,
        dc_identical_concurrent_writes_land_once,
        dc_max_length_record_round_trips,
        dc_scan_orders_filters_and_pages,
        dc_scan_page_is_full_unless_last,
        dc_concurrent_allocations_are_unique,
        dc_reopen_keeps_records_and_allocator_continues_above,
        global_scan_pages_in_key_order,
        dc_events_record_every_change_of_holder_and_nothing_else,
        dc_concurrent_writes_get_contiguous_event_seqs,
        dc_events_survive_reopen,
        dc_migration_mark_is_kept_until_cleared,
        dc_keys_created_counts_first_reservations_per_namespace,
        dc_scan_scopes_cover_exactly_their_namespaces,
        dc_import_copies_records_and_events_without_overwriting,
        dc_allocator_floor_bounds_uniques_and_raise_skips_past,
        dc_due_lists_exactly_what_is_due_and_follows_writes,
        global_dc_lease_renews_and_keeps_the_highest_marks,
        global_dc_lease_lapses_then_expires_without_renewals,
        global_dc_retired_is_refused_for_good,
        global_successor_is_write_once_and_checks_its_cause,
        global_set_successor_whose_answer_was_lost_is_written_once,
        global_an_import_losing_its_answer_finds_a_succession_already_there,
        global_take_over_waits_for_the_dc_lease_to_expire,
        global_takeovers_racing_a_renewal_are_refused_or_reconciled,
        global_concurrent_successions_have_exactly_one_winner,
        global_successions_of_pages_in_unique_order,
        global_import_succession_is_write_once_for_either_cause,
        global_import_and_serving_successions_exclude_each_other,
        global_scan_successions_lists_every_dc_in_order,
        global_setting_is_changed_only_by_a_matching_swap,
        global_settings_are_independent_of_each_other_and_of_entries,
        global_setting_above_its_bound_is_refused,
        global_concurrent_setting_swaps_have_exactly_one_winner,
        global_setting_swap_whose_answer_was_lost_is_set_once,
        dc_session_rows_change_only_by_compare_and_set,
        dc_concurrent_session_renewals_have_exactly_one_winner,
        dc_records_join_and_freeze_only_under_their_sessions_guard,
        dc_session_keys_and_notices_follow_every_write,
        dc_due_sessions_follow_renewals_ends_and_deletes,
        dc_import_session_copies_rows_without_overwriting,
        dc_sessions_page_every_row_in_name_order,
        }
    };
}

/// Runs every case in sequence, printing each name.
pub async fn run_all(b: &dyn Backend) {
    macro_rules! run {
        ($($case:ident),* $(,)?) => {$(
            println!("conformance: {}", stringify!($case));
            $case(b).await;
        )*};
    }
    conformance_cases!((run) {});
}

/// One `#[tokio::test]` per conformance case, each opening its stores through
/// the [`Backend`] that `$backend` evaluates to (evaluated once per test).
#[macro_export]
macro_rules! conformance_tests {
    ($backend:expr) => {
        $crate::conformance_cases!(($crate::conformance_tests) { @cases $backend; });
    };
    (@cases $backend:expr; $($case:ident),* $(,)?) => {$(
        #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
        async fn $case() {
            let backend = $backend;
            $crate::conformance::$case(&backend).await;
        }
    )*};
}

/// The in-memory backend: every place is a fresh store; not durable.
pub struct MemoryBackend;

#[async_trait]
impl Backend for MemoryBackend {
    async fn global_store(&self, _place: &str) -> Arc<dyn GlobalStore> {
        Arc::new(crate::MemoryGlobalStore::new())
    }
    async fn dc_store(&self, _place: &str) -> Arc<dyn DcStore> {
        Arc::new(crate::MemoryDcStore::new())
    }
    fn durable(&self) -> bool {
        false
    }
}

#[cfg(test)]
mod memory_backend {
    crate::conformance_tests!(crate::conformance::MemoryBackend);
}
