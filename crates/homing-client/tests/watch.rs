//! The Watcher against a scripted DC over real QUIC: events come out in
//! order, the cursor moves past skipped events only once their batch is
//! handed out, an unavailable DC is retried, and a trimmed cursor ends the
//! watch with an error that says what was missed.

mod support;

use std::time::Duration;

use homing_client::{WatchError, Watcher};
use homing_core::{
    ActorId, ErrorKind, ErrorReply, Event, EventKind, FencingToken, NamespaceScope, Reply,
};
use homing_net::DevCa;
use support::{TestDc, client, id, key};

fn event(seq: u64, name: &str) -> Event {
    Event {
        seq,
        reservation: id("iad.1"),
        key: key(name),
        token: FencingToken::FIRST,
        kind: EventKind::Reserved {
            actor: ActorId::new("a").unwrap(),
            tag: None,
            predecessor: None,
        },
    }
}

fn batch(seqs: &[u64], next: u64) -> Reply {
    Reply::Events {
        events: seqs.iter().map(|s| event(*s, &format!("k{s}"))).collect(),
        next,
    }
}

#[tokio::test]
async fn a_watcher_yields_in_order_retries_outages_and_stops_at_a_trimmed_cursor() {
    tokio::time::timeout(Duration::from_secs(20), async {
        let ca = DevCa::generate("watch test ca").unwrap();
        let dc = TestDc::start(&ca, "iad").await;
        {
            let mut script = dc.script.watch.lock().unwrap();
            // Seqs 1 and 2, then 3..=5 were outside the scope: next = 5.
            script.push_back(batch(&[1, 2], 5));
            script.push_back(Reply::Error(ErrorReply::new(
                ErrorKind::Unavailable { dc: dc.dc.clone() },
                "store down",
            )));
            script.push_back(batch(&[6], 6));
            script.push_back(Reply::Error(ErrorReply::new(
                ErrorKind::Trimmed { oldest: 50 },
                "trimmed",
            )));
        }
        let router = client(&ca, homing_core::Role::Router, None);
        let mut watcher =
            Watcher::new(router, dc.peer(), NamespaceScope::everything(), 0).with_wait_ms(50);
        assert_eq!(watcher.next().await.unwrap().seq, 1);
        assert_eq!(
            watcher.cursor(),
            1,
            "mid-batch: the cursor is the event handed out"
        );
        assert_eq!(watcher.next().await.unwrap().seq, 2);
        assert_eq!(
            watcher.cursor(),
            5,
            "batch done: skipped events are behind the cursor"
        );
        // The outage is retried; the next batch asks from 5.
        assert_eq!(watcher.next().await.unwrap().seq, 6);
        let afters: Vec<u64> = dc
            .script
            .log
            .lock()
            .unwrap()
            .iter()
            .filter_map(|r| match r {
                homing_core::Request::Watch { after, .. } => Some(*after),
                _ => None,
            })
            .collect();
        assert_eq!(afters, [0, 5, 5]);
        match watcher.next().await {
            Err(WatchError::Trimmed { cursor, oldest, .. }) => {
                assert_eq!((cursor, oldest), (6, 50))
            }
            other => panic!("expected Trimmed, got {other:?}"),
        }
    })
    .await
    .unwrap();
}

#[tokio::test]
async fn the_stream_form_yields_the_same_events_and_resumes_from_a_cursor() {
    tokio::time::timeout(Duration::from_secs(20), async {
        let ca = DevCa::generate("watch test ca").unwrap();
        let dc = TestDc::start(&ca, "iad").await;
        dc.script.watch.lock().unwrap().push_back(batch(&[8, 9], 9));
        let router = client(&ca, homing_core::Role::Router, None);
        let watcher = Watcher::new(router, dc.peer(), NamespaceScope::everything(), 7);
        let mut stream = std::pin::pin!(watcher.into_stream());
        let mut seqs = Vec::new();
        for _ in 0..2 {
            let next =
                std::future::poll_fn(|cx| futures_core::Stream::poll_next(stream.as_mut(), cx))
                    .await;
            seqs.push(next.unwrap().unwrap().seq);
        }
        assert_eq!(seqs, [8, 9]);
        let first = dc.script.log.lock().unwrap()[0].clone();
        assert!(matches!(
            first,
            homing_core::Request::Watch { after: 7, .. }
        ));
    })
    .await
    .unwrap();
}
