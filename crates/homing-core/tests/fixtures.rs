//! Golden fixtures of the wire format: one frame per case under
//! `tests/fixtures/wire/v<PROTOCOL_VERSION>/`, each decoded and compared
//! with the value below, and the value encoded and compared with the file
//! byte for byte. Every variant of every enum a frame carries has a case;
//! `every_variant_has_a_case` asks the decoder how many there are.
//! `HOMING_BLESS_FIXTURES=1` writes missing files; see the README there.

mod golden;

use std::fmt::Debug;
use std::path::Path;

use golden::samples::{self, actor, failed, id, key, lease_key, plain_key, shortcut, tag};
use golden::{Case, Version};
use homing_core::wire::{
    self, ALPN, AwaitReply, ErrorKind, ErrorReply, PROTOCOL_VERSION, PROTOCOL_VERSION_OLDEST,
    Reply, Request, Versioned,
};
use homing_core::{
    AcquireReply, DcReport, Deadlines, EventKind, FencingToken, Grant, Holder, HostTime, KeyConfig,
    Link, LinkReply, Namespace, NamespaceScope, PeerProbe, PreviousRun, Probe, RecordState,
    ReleaseCause, ReleaseReply, RenewReply, RunOutcome, ScanCursor, Segment, SessionCounts,
    SessionId, SessionKey, SessionNotice, SessionRenewReply, Succession, SuccessionCause,
    TailState, TailView,
};
use serde::Serialize;
use serde::de::DeserializeOwned;

fn cursor() -> ScanCursor {
    ScanCursor {
        key: key(),
        id: id("iad.42"),
    }
}

fn requests() -> Vec<(&'static str, Request)> {
    let scope = NamespaceScope::subtree(Namespace::new("games").expect("valid namespace"));
    vec![
        ("resolve", Request::Resolve { key: key() }),
        ("directory", Request::Directory),
        ("dc-report", Request::DcReport),
        (
            "open-session",
            Request::OpenSession {
                secret: lease_key(),
                host_time: HostTime::from_ms(1_700_000_000_500),
            },
        ),
        (
            "renew-session",
            Request::RenewSession {
                session: session(),
                secret: lease_key(),
                host_time: HostTime::from_ms(1_700_000_003_500),
                ack: 17,
            },
        ),
        (
            "close-session",
            Request::CloseSession {
                session: session(),
                secret: lease_key(),
            },
        ),
        (
            "session-keys",
            Request::SessionKeys {
                session: session(),
                secret: lease_key(),
                after: Some(id("iad.42")),
            },
        ),
        (
            "acquire-in-session",
            Request::AcquireInSession {
                config: KeyConfig {
                    name: Some(key().name),
                    namespace: key().namespace,
                    tag: Some(tag()),
                },
                actor: actor(),
                lease: lease_key(),
                host_time: HostTime::from_ms(1_700_000_000_500),
                wait_ms: 30_000,
                session: session(),
                secret: lease_key(),
            },
        ),
        (
            "resolve-reservation",
            Request::ResolveReservation { id: id("iad.42") },
        ),
        (
            "acquire",
            Request::Acquire {
                config: KeyConfig {
                    name: Some(key().name),
                    namespace: key().namespace,
                    tag: Some(tag()),
                },
                actor: actor(),
                lease: lease_key(),
                host_time: HostTime::from_ms(1_700_000_000_500),
                wait_ms: 30_000,
            },
        ),
        (
            "acquire-unnamed",
            Request::Acquire {
                config: KeyConfig::default(),
                actor: actor(),
                lease: lease_key(),
                host_time: HostTime::from_ms(5),
                wait_ms: 0,
            },
        ),
        (
            "renew",
            Request::Renew {
                reservation: id("iad.42"),
                token: FencingToken::new(7),
                lease: lease_key(),
                host_time: HostTime::from_ms(1_700_000_000_500),
            },
        ),
        (
            "release",
            Request::Release {
                reservation: id("iad.42"),
                token: FencingToken::new(7),
                lease: lease_key(),
                outcome: failed(),
            },
        ),
        (
            "cancel",
            Request::Cancel {
                key: key(),
                lease: lease_key(),
            },
        ),
        (
            "force-release",
            Request::ForceRelease {
                reservation: id("iad.42"),
                token: FencingToken::new(7),
            },
        ),
        (
            "link",
            Request::Link {
                key: key(),
                from: id("iad.42"),
                to: id("fra.9000"),
                expected_token: FencingToken::new(7),
            },
        ),
        (
            "shortcut",
            Request::Shortcut {
                key: key(),
                entry: id("iad.1"),
                shortcut: shortcut(),
            },
        ),
        ("drain", Request::Drain { key: plain_key() }),
        ("inspect", Request::Inspect { key: key() }),
        (
            "await",
            Request::Await {
                reservation: id("iad.42"),
                wait_ms: 300_000,
            },
        ),
        (
            "watch",
            Request::Watch {
                scope: scope.clone(),
                after: 1_000,
                wait_ms: 10_000,
            },
        ),
        (
            "scan",
            Request::Scan {
                scope: scope.clone(),
                after: Some(cursor()),
            },
        ),
        (
            "drain-scope",
            Request::DrainScope {
                scope: NamespaceScope::everything(),
                after: None,
            },
        ),
        (
            "successor",
            Request::Successor {
                key: key(),
                id: id("iad.42"),
            },
        ),
    ]
}

fn deadlines() -> Deadlines {
    Deadlines {
        renew_at: HostTime::from_ms(1_700_000_010_000),
        soft_terminate_at: HostTime::from_ms(1_700_000_025_000),
        hard_terminate_at: HostTime::from_ms(1_700_000_028_000),
    }
}

fn segment(state: TailState) -> Segment {
    Segment {
        key: key(),
        links: vec![Link {
            from: id("iad.1"),
            to: id("iad.42"),
            token: FencingToken::new(3),
        }],
        tail: Some(TailView {
            id: id("iad.42"),
            token: FencingToken::new(7),
            tag: Some(tag()),
            state,
        }),
        shortcut: Some(shortcut()),
    }
}

fn tail_states() -> Vec<(&'static str, TailState)> {
    vec![
        ("active", TailState::Active { actor: actor() }),
        (
            "vacant",
            TailState::Vacant {
                ended: ReleaseCause::Forced,
            },
        ),
    ]
}

fn acquire_replies() -> Vec<(&'static str, AcquireReply)> {
    vec![
        (
            "acquired",
            AcquireReply::Acquired(Grant {
                key: key(),
                reservation: id("iad.42"),
                token: FencingToken::new(7),
                deadlines: deadlines(),
                previous: Some(PreviousRun {
                    reservation: id("iad.41"),
                    token: FencingToken::new(6),
                    ended: ReleaseCause::Released(RunOutcome::Ok),
                }),
            }),
        ),
        (
            "held-elsewhere",
            AcquireReply::HeldElsewhere(Holder {
                key: key(),
                reservation: id("fra.9000"),
                actor: actor(),
                token: FencingToken::new(12),
            }),
        ),
        (
            "tag-mismatch",
            AcquireReply::TagMismatch {
                existing: Some(tag()),
            },
        ),
    ]
}

fn renew_replies() -> Vec<(&'static str, RenewReply)> {
    let current = FencingToken::new(8);
    vec![
        ("renewed", RenewReply::Renewed(deadlines())),
        ("draining", RenewReply::Draining),
        ("stale-token", RenewReply::StaleToken { current }),
        ("expired", RenewReply::Expired),
        ("not-holder", RenewReply::NotHolder),
    ]
}

fn release_replies() -> Vec<(&'static str, ReleaseReply)> {
    let current = FencingToken::new(8);
    vec![
        ("released", ReleaseReply::Released),
        ("stale-token", ReleaseReply::StaleToken { current }),
        ("not-holder", ReleaseReply::NotHolder),
    ]
}

fn link_replies() -> Vec<(&'static str, LinkReply)> {
    let token = FencingToken::new(8);
    vec![
        ("linked", LinkReply::Linked),
        ("already-linked", LinkReply::AlreadyLinked(id("fra.9000"))),
        (
            "still-active",
            LinkReply::StillActive {
                actor: actor(),
                token,
            },
        ),
        ("token-moved", LinkReply::TokenMoved { current: token }),
        ("abandoned", LinkReply::Abandoned),
        ("other-key", LinkReply::OtherKey),
    ]
}

fn await_replies() -> Vec<(&'static str, AwaitReply)> {
    let ended = ReleaseCause::Cancelled;
    vec![
        ("vacated", AwaitReply::Vacated { ended }),
        ("moved", AwaitReply::Moved),
        ("timed-out", AwaitReply::TimedOut),
    ]
}

fn session() -> SessionId {
    "iad~7".parse().expect("valid session id")
}

fn session_renew_replies() -> Vec<(&'static str, SessionRenewReply)> {
    vec![
        (
            "renewed",
            SessionRenewReply::Renewed {
                deadlines: deadlines(),
                notices: vec![SessionNotice {
                    seq: 18,
                    reservation: id("iad.43"),
                }],
            },
        ),
        ("expired", SessionRenewReply::Expired),
        ("not-holder", SessionRenewReply::NotHolder),
    ]
}

fn error_kinds() -> Vec<(&'static str, ErrorKind)> {
    vec![
        ("unauthorized", ErrorKind::Unauthorized),
        ("bad-request", ErrorKind::BadRequest),
        ("unknown-reservation", ErrorKind::UnknownReservation),
        (
            "unavailable",
            ErrorKind::Unavailable {
                dc: "fra".parse().expect("valid dc"),
            },
        ),
        ("inconsistent", ErrorKind::Inconsistent),
        ("overloaded", ErrorKind::Overloaded),
        ("trimmed", ErrorKind::Trimmed { oldest: 1_000 }),
        ("internal", ErrorKind::Internal),
        (
            "quota-exceeded",
            ErrorKind::QuotaExceeded { keys_max: 100_000 },
        ),
        ("session-ended", ErrorKind::SessionEnded),
    ]
}

/// Every reply: one per variant, and one per variant of the enum a
/// variant carries.
fn replies() -> Vec<(String, Reply)> {
    // Records of keys held under a host session are a form versions 7 and
    // 8 cannot read: a reply of theirs never carries one.
    let records = || {
        let records = samples::records().into_iter().map(|(_, r)| r);
        records.filter(|r| r.session().is_none()).collect()
    };
    let events = samples::events().into_iter().map(|(_, e)| e).collect();
    let mut replies = vec![
        (
            "directory".to_string(),
            Reply::Directory(samples::directory()),
        ),
        (
            "dc-report".to_string(),
            Reply::DcReport(DcReport {
                live_leases: 1_250,
                sessions: Some(SessionCounts {
                    rows: 3,
                    keys: 30_000,
                }),
                dc_store: Probe::Answered { micros: 412 },
                global_store: Probe::Failed("no answer within 2000 ms".to_string()),
                peers: vec![
                    PeerProbe {
                        dc: homing_core::DcId::new("fra").expect("a valid dc"),
                        probe: Probe::Answered { micros: 90_150 },
                    },
                    PeerProbe {
                        dc: homing_core::DcId::new("sin").expect("a valid dc"),
                        probe: Probe::Failed("none within 2000 ms".to_string()),
                    },
                ],
            }),
        ),
        (
            "dc-report-uncounted".to_string(),
            Reply::DcReport(DcReport {
                live_leases: 0,
                sessions: None,
                dc_store: Probe::Failed("store unavailable".to_string()),
                global_store: Probe::Answered { micros: 1_903 },
                peers: Vec::new(),
            }),
        ),
        (
            "session-opened".to_string(),
            Reply::SessionOpened {
                session: session(),
                deadlines: deadlines(),
            },
        ),
        ("session-closed".to_string(), Reply::SessionClosed(true)),
        (
            "session-keys".to_string(),
            Reply::SessionKeys {
                keys: vec![
                    SessionKey {
                        reservation: id("iad.42"),
                        key: key(),
                        token: FencingToken::new(3),
                        frozen: false,
                    },
                    SessionKey {
                        reservation: id("iad.43"),
                        key: key(),
                        token: FencingToken::new(1),
                        frozen: true,
                    },
                ],
                more: true,
            },
        ),
        (
            "inspected-in-session".to_string(),
            Reply::Inspected {
                records: samples::records()
                    .into_iter()
                    .map(|(_, r)| r)
                    .filter(|r| r.session().is_some())
                    .collect(),
            },
        ),
        (
            "resolved".to_string(),
            Reply::Resolved {
                entry: Some(id("iad.1")),
                segment: Some(segment(TailState::Active { actor: actor() })),
            },
        ),
        (
            "resolved-never-reserved".to_string(),
            Reply::Resolved {
                entry: None,
                segment: None,
            },
        ),
        ("cancelled".to_string(), Reply::Cancelled(true)),
        ("noted".to_string(), Reply::Noted(true)),
        ("drained".to_string(), Reply::Drained),
        (
            "inspected".to_string(),
            Reply::Inspected { records: records() },
        ),
        (
            "events".to_string(),
            Reply::Events {
                events,
                next: 1_008,
            },
        ),
        (
            "records".to_string(),
            Reply::Records {
                records: records(),
                next: Some(cursor()),
            },
        ),
        (
            "drained-page".to_string(),
            Reply::DrainedPage {
                drained: 250,
                next: Some(cursor()),
            },
        ),
        (
            "successor".to_string(),
            Reply::Successor {
                succession: Some(Succession {
                    link: Link {
                        from: id("iad.42"),
                        to: id("fra.9000"),
                        token: FencingToken::new(7),
                    },
                    cause: SuccessionCause::TakenOver,
                }),
                hint: Some(shortcut()),
            },
        ),
    ];
    let mut add = |prefix: &str, reply: &dyn Fn() -> Vec<(&'static str, Reply)>| {
        replies.extend(
            reply()
                .into_iter()
                .map(|(name, r)| (format!("{prefix}-{name}"), r)),
        );
    };
    add("reservation", &|| {
        let tails = tail_states().into_iter();
        tails
            .map(|(n, s)| (n, Reply::Reservation(segment(s))))
            .collect()
    });
    add("acquire", &|| map(acquire_replies(), Reply::Acquire));
    add("renew", &|| map(renew_replies(), Reply::Renew));
    add("release", &|| map(release_replies(), Reply::Release));
    add("link", &|| map(link_replies(), Reply::Link));
    add("awaited", &|| map(await_replies(), Reply::Awaited));
    add("session-renewed", &|| {
        map(session_renew_replies(), Reply::SessionRenewed)
    });
    add("error", &|| {
        map(error_kinds(), |kind| {
            Reply::Error(ErrorReply::new(kind, "dc fra did not answer in 10 s"))
        })
    });
    replies
}

fn map<T, U>(named: Vec<(&'static str, T)>, f: impl Fn(T) -> U) -> Vec<(&'static str, U)> {
    named.into_iter().map(|(n, v)| (n, f(v))).collect()
}

fn frame<T: Serialize>(message: &T) -> Vec<u8> {
    wire::encode(message).expect("every fixture fits a frame")
}

/// The cases of the messages protocol `version` added.
fn cases(version: u16) -> Vec<Case> {
    let added = |message: &dyn Versioned| message.since() == version;
    let requests = requests().into_iter().filter(|(_, r)| added(r));
    let replies = replies().into_iter().filter(|(_, r)| added(r));
    let requests = requests.map(|(name, request)| {
        let name = format!("request-{name}");
        Case::round_trip(&name, request, frame, wire::decode::<Request>)
    });
    let replies = replies.map(|(name, reply)| {
        let name = format!("reply-{name}");
        Case::round_trip(&name, reply, frame, wire::decode::<Reply>)
    });
    requests.chain(replies).collect()
}

#[test]
fn wire_fixtures_decode_to_their_values_and_encode_to_their_bytes() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/wire");
    // A version's messages are encoded the same by every later version (a
    // version only adds variants), so each is checked both ways.
    let versions = (PROTOCOL_VERSION_OLDEST..=PROTOCOL_VERSION)
        .map(|version| Version {
            dir: format!("v{version}"),
            cases: cases(version),
        })
        .collect();
    golden::check(&root, versions);
}

/// The newest fixtures directory is named after `PROTOCOL_VERSION`; peers
/// agree on `ALPN`: the two must be one version.
#[test]
fn the_fixtures_version_is_the_one_alpn_carries() {
    assert_eq!(ALPN, wire::alpn(PROTOCOL_VERSION));
    assert_eq!(wire::version_of_alpn(ALPN), Some(PROTOCOL_VERSION));
}

/// On a connection of an older version, a newer message is neither sent
/// nor accepted.
#[test]
fn a_message_of_a_newer_version_is_refused_on_an_older_connection() {
    let older = PROTOCOL_VERSION_OLDEST;
    for (name, request) in requests() {
        let fits = request.since() <= older;
        assert_eq!(wire::check_version(&request, older).is_ok(), fits, "{name}");
        let decoded = wire::decode_for::<Request>(older, &frame(&request));
        assert_eq!(decoded.is_ok(), fits, "{name}");
    }
    for (name, reply) in replies() {
        let decoded = wire::decode_for::<Reply>(older, &frame(&reply));
        assert_eq!(decoded.is_ok(), reply.since() <= older, "{name}");
    }
}

/// The variant indices `T`'s decoder accepts: postcard starts an enum with
/// its variant index, so a one-byte frame of an unknown index is refused as
/// such, and one of a known index decodes or runs out of bytes.
fn variants<T: DeserializeOwned>() -> Vec<u8> {
    let ran_out = wire::decode::<u32>(&[]).expect_err("no bytes is no u32");
    (0..0x80)
        .filter(|&i| match wire::decode::<T>(&[i]) {
            Ok(_) => true,
            Err(e) => e == ran_out,
        })
        .collect()
}

/// Fails unless the values cover every variant of `T` the decoder knows.
fn assert_covers<T: Serialize + DeserializeOwned + Debug>(what: &str, values: &[T]) {
    let mut covered: Vec<u8> = values.iter().map(|v| frame(v)[0]).collect();
    covered.sort_unstable();
    covered.dedup();
    let known = variants::<T>();
    assert!(!known.is_empty(), "{what}: the probe found no variant");
    assert_eq!(
        covered, known,
        "{what}: the fixtures cover these variant indices, the decoder knows those: \
         add a case for each variant missing"
    );
}

fn values<T>(named: Vec<(impl Sized, T)>) -> Vec<T> {
    named.into_iter().map(|(_, v)| v).collect()
}

#[test]
fn every_variant_has_a_case() {
    assert_covers("Request", &values(requests()));
    assert_covers("Reply", &values(replies()));
    assert_covers("AcquireReply", &values(acquire_replies()));
    assert_covers("RenewReply", &values(renew_replies()));
    assert_covers("ReleaseReply", &values(release_replies()));
    assert_covers("LinkReply", &values(link_replies()));
    assert_covers("AwaitReply", &values(await_replies()));
    assert_covers("ErrorKind", &values(error_kinds()));
    assert_covers("SessionRenewReply", &values(session_renew_replies()));
    assert_covers("TailState", &values(tail_states()));
    let records = values(samples::records());
    let states: Vec<RecordState> = records.into_iter().map(|r| r.state).collect();
    assert_covers("RecordState", &states);
    let events = values(samples::events());
    let kinds: Vec<EventKind> = events.into_iter().map(|e| e.kind).collect();
    assert_covers("EventKind", &kinds);
}
