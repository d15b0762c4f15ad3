//! Golden fixtures of the store format: the bytes `keyspace` writes for
//! keys, index keys and values, shared by the redb, etcd and FoundationDB
//! backends, one file per case under `tests/fixtures/store/v1/`. Each file
//! is decoded and compared with the value below, and the value encoded and
//! compared with the file byte for byte; record formats that are read but
//! no longer written are decoded only. `HOMING_BLESS_FIXTURES=1` writes
//! missing files; see the README there.

#[path = "../../homing-core/tests/golden/mod.rs"]
mod golden;

use std::path::Path;

use golden::samples::{self, id, key, plain_key};
use golden::{Case, Version};
use homing_core::{
    DcMarks, DcTerms, Due, DueCursor, DueKind, FencingToken, Link, RecordState, ReservationId,
    Succession, SuccessionCause,
};
use homing_store::dc_lease::DcEntry;
use homing_store::deployment::DeploymentVersion;
use homing_store::keyspace;
use homing_store::session;
use homing_store::setting::Setting;

/// The store has no format number of its own: this directory is its first.
const STORE_FORMAT_DIR: &str = "v1";

/// Stored keys: what a global entry, a record's scan index entry, an expiry
/// index entry, an event, a succession and each setting are stored under,
/// and the stored form of a reservation ID (a record's key, every index's
/// value, a global entry's value).
fn key_cases() -> Vec<Case> {
    let due =
        |kind: DueKind| move |c: &DueCursor| keyspace::due_bytes(Due { kind, at: c.at }, &c.id);
    let cursor = || DueCursor {
        at: samples::at(),
        id: id("iad.42"),
    };
    let settings = Setting::ALL.map(|setting| {
        let name = format!("setting-key-{setting}");
        Case::written_only(&name, keyspace::setting_key(setting).to_vec())
    });
    let mut cases = vec![
        Case::round_trip(
            "key-default-namespace",
            plain_key(),
            keyspace::key_bytes,
            keyspace::decode_key,
        ),
        Case::round_trip(
            "key-namespaced",
            key(),
            keyspace::key_bytes,
            keyspace::decode_key,
        ),
        Case::written_only(
            "record-scan-key",
            keyspace::record_scan_bytes(&key(), &id("iad.42")),
        ),
        Case::round_trip(
            "due-key-lease",
            cursor(),
            due(DueKind::Lease),
            keyspace::decode_due,
        ),
        Case::round_trip(
            "due-key-released",
            cursor(),
            due(DueKind::Released),
            keyspace::decode_due,
        ),
        Case::written_only("event-seq-key", keyspace::event_seq_bytes(1_000).to_vec()),
        Case::round_trip(
            "succession-key",
            id("iad.18446744073709551615"),
            keyspace::succession_key,
            keyspace::decode_succession_key,
        ),
        Case::round_trip(
            "reservation-id",
            id("iad.42"),
            keyspace::id_bytes,
            keyspace::decode_id,
        ),
    ];
    cases.extend(settings);
    cases
}

/// A record as the formats before lease keys read it: an active lease
/// without lease key or previous run.
fn before_lease_keys(shortcut: bool) -> homing_core::DcRecord {
    let (_, mut record) = samples::records().swap_remove(0);
    let RecordState::Active {
        lease, previous, ..
    } = &mut record.state
    else {
        unreachable!("the first sample record is active")
    };
    (*lease, *previous) = (None, None);
    if !shortcut {
        record.shortcut = None;
    }
    record
}

fn record_cases() -> Vec<Case> {
    let encode = |r: &homing_core::DcRecord| keyspace::encode_record(r).expect("fits");
    let mut cases: Vec<Case> = samples::records()
        .into_iter()
        .map(|(name, record)| {
            let name = format!("record-{name}");
            Case::round_trip(&name, record, encode, keyspace::decode_record)
        })
        .collect();
    cases.push(Case::read_only(
        "record-before-lease-keys",
        before_lease_keys(true),
        keyspace::decode_record,
    ));
    cases.push(Case::read_only(
        "record-before-shortcuts",
        before_lease_keys(false),
        keyspace::decode_record,
    ));
    cases
}

fn event_cases() -> Vec<Case> {
    let encode = |e: &homing_core::Event| keyspace::encode_event(e).expect("fits");
    samples::events()
        .into_iter()
        .map(|(name, event)| {
            let name = format!("event-{name}");
            Case::round_trip(&name, event, encode, keyspace::decode_event)
        })
        .collect()
}

fn global_value_cases() -> Vec<Case> {
    let renewed = DcEntry {
        terms: Some(DcTerms {
            ttl_ms: 20_000,
            host_lease_ttl_max_ms: 30_000,
            grace_ms: 2_000,
        }),
        marks: DcMarks {
            allocator_floor: 1_048_576,
            token_bound: 4_096,
            event_head: 1_000,
        },
        retired: false,
    };
    let retired = DcEntry::default().retire();
    let succession = |cause, to: &str| Succession {
        link: Link {
            from: id("iad.42"),
            to: id(to),
            token: FencingToken::new(7),
        },
        cause,
    };
    let from: ReservationId = id("iad.42");
    let decode_succession = move |b: &[u8]| keyspace::decode_succession(&from, b);
    let dc_entry = |name, entry| {
        let encode = keyspace::encode_dc_entry;
        Case::round_trip(name, entry, encode, keyspace::decode_dc_entry)
    };
    let setting = |name, value| {
        let encode = |v: &_| homing_core::wire::encode(v).expect("a setting fits");
        Case::round_trip(name, value, encode, homing_core::wire::decode)
    };
    let deployment = DeploymentVersion {
        version: 8,
        new_form_written: true,
    };
    vec![
        setting("setting-directory", samples::directory()),
        Case::round_trip(
            "setting-deployment-version",
            deployment,
            |v| homing_core::wire::encode(v).expect("a setting fits"),
            homing_core::wire::decode,
        ),
        dc_entry("dc-entry-renewed", renewed),
        dc_entry("dc-entry-retired-never-renewed", retired),
        Case::round_trip(
            "succession-moved",
            succession(SuccessionCause::Moved, "fra.9000"),
            keyspace::encode_succession,
            decode_succession.clone(),
        ),
        Case::round_trip(
            "succession-taken-over",
            succession(SuccessionCause::TakenOver, "lhr.1"),
            keyspace::encode_succession,
            decode_succession,
        ),
    ]
}

/// Host sessions: the rows, and what their three indexes are keyed by.
fn session_cases() -> Vec<Case> {
    let encode = |row: &homing_core::SessionRecord| session::encode_session(row).expect("fits");
    let mut cases: Vec<Case> = samples::sessions()
        .into_iter()
        .map(|(name, row)| {
            let name = format!("session-{name}");
            Case::round_trip(&name, row, encode, session::decode_session)
        })
        .collect();
    let (_, live) = samples::sessions().swap_remove(0);
    cases.extend([
        Case::round_trip(
            "session-id",
            samples::session_id(),
            session::session_bytes,
            session::decode_session_id,
        ),
        Case::written_only(
            "session-key-entry",
            session::session_key_entry(&samples::session_id(), &id("iad.42")),
        ),
        Case::written_only(
            "session-notice-entry",
            session::session_notice_entry(&samples::session_id(), 13),
        ),
        Case::written_only("session-due-entry", session::session_due_entry(&live)),
    ]);
    cases
}

#[test]
fn store_fixtures_decode_to_their_values_and_encode_to_their_bytes() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/store");
    let cases = [
        key_cases(),
        record_cases(),
        event_cases(),
        global_value_cases(),
        session_cases(),
    ];
    let current = Version {
        dir: STORE_FORMAT_DIR.to_string(),
        cases: cases.into_iter().flatten().collect(),
    };
    golden::check(&root, vec![current]);
}
