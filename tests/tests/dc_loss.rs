//! Losing a DC's store, and retiring a DC, on real processes (issue 20):
//! three `homingd` over a real 3-member etcd. A DC restarted under its id on
//! a wiped data dir is refused (it would hand out reservation IDs that
//! existing entries name) until started with `--start-above-floor`, which
//! continues above every ID it used. `homing dc retire` (the real CLI) stops
//! a running DC's grants within its DC lease and refuses its restart;
//! `homing dc status` shows it. A DC killed (`kill -9`) for good has every
//! key it hosted taken over by the other DCs once the global store judges
//! its DC lease expired, and never before its holders' hard deadlines.
//! `homing dc status` asks each DC in --dc for its report: live leases, its
//! DC store's health, its round trip to every other DC; a killed DC shows
//! as no report, and as a failed round trip in the others'.

#![cfg(feature = "etcd")]

use std::process::{Command, Output};
use std::time::Duration;

use homing_core::{
    AcquireReply, DcId, ErrorKind, FencingToken, Grant, HostTime, LeasePolicy, Reply, Request,
    ReservationId,
};
use homing_e2e::cluster::{Cluster, acquire, dc, host_now, lease_of};
use homing_e2e::homingd::homing_binary;
use homing_e2e::{ClusterOptions, start_or_skip};

/// Upper bound on each scenario, so a hang fails instead of stalling CI.
const SCENARIO_TIMEOUT: Duration = Duration::from_secs(120);

async fn acquire_at(cluster: &Cluster, at: &DcId, name: &str) -> Result<ReservationId, Reply> {
    match cluster
        .ask(&cluster.host(at), at, &acquire(name, "10.9.0.1:9000"))
        .await
    {
        Ok(Reply::Acquire(AcquireReply::Acquired(Grant { reservation, .. }))) => Ok(reservation),
        Ok(other) => Err(other),
        Err(e) => panic!("acquire {name} at {at}: {e}\n{}", cluster.logs()),
    }
}

/// Runs the `homing` CLI to completion.
async fn homing(args: &[&str]) -> Output {
    let mut command = Command::new(homing_binary());
    command.args(args).env("HOMING_LOG", "warn");
    let run = tokio::task::spawn_blocking(move || command.output());
    tokio::time::timeout(Duration::from_secs(30), run)
        .await
        .expect("homing finished in time")
        .unwrap()
        .expect("homing ran")
}

/// `homing dc status --json` on `stores`: `dc`'s row, and the whole answer.
async fn status_row(stores: &str, dc: &str) -> (serde_json::Value, serde_json::Value) {
    let status = homing(&["dc", "status", "--stores", stores, "--json"]).await;
    assert!(status.status.success(), "{}", text(&status));
    let json: serde_json::Value = serde_json::from_slice(&status.stdout).unwrap();
    let row = json["dcs"]
        .as_array()
        .unwrap()
        .iter()
        .find(|d| d["dc"] == dc)
        .cloned()
        .unwrap_or_else(|| panic!("{dc} not listed: {json}"));
    (row, json)
}

fn text(output: &Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dc_loss_a_wiped_data_dir_is_refused_and_start_above_floor_never_reuses_an_id() {
    let Some(mut cluster) = start_or_skip("dc_loss", ClusterOptions::short_lease()).await else {
        return;
    };
    tokio::time::timeout(SCENARIO_TIMEOUT, async {
        let iad = dc("iad");
        let mut used = Vec::new();
        for i in 0..5 {
            used.push(
                acquire_at(&cluster, &iad, &format!("wiped-{i}"))
                    .await
                    .unwrap(),
            );
        }
        let highest = used.iter().map(ReservationId::unique).max().unwrap();
        let daemon = cluster.daemon(&iad);
        daemon.kill();
        let data = daemon.data_dir().to_path_buf();
        std::fs::remove_dir_all(&data).unwrap();
        std::fs::create_dir_all(&data).unwrap();
        let refused = daemon
            .restart()
            .await
            .expect_err("a wiped dc store was served");
        assert!(
            refused.contains("is behind what iad already handed out")
                && refused.contains("--start-above-floor"),
            "{refused}"
        );
        daemon
            .restart_with(&["--start-above-floor"])
            .await
            .expect("serves above the floor");
        let fresh = acquire_at(&cluster, &iad, "after-wipe").await.unwrap();
        assert!(
            fresh.unique() > highest,
            "{fresh} reuses an id at or below iad.{highest}"
        );
    })
    .await
    .expect("scenario finished in time");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dc_loss_a_retired_dc_stops_granting_is_shown_retired_and_is_refused_on_restart() {
    let Some(mut cluster) = start_or_skip("dc_loss", ClusterOptions::short_lease()).await else {
        return;
    };
    tokio::time::timeout(SCENARIO_TIMEOUT, async {
        let (iad, fra) = (dc("iad"), dc("fra"));
        acquire_at(&cluster, &iad, "before-retire").await.unwrap();
        let stores = cluster.store_spec();
        let (iad_row, json) = status_row(&stores, "iad").await;
        assert_eq!(iad_row["lease"], "live", "{json}");
        assert!(iad_row["allocator_floor"].as_u64().unwrap() >= 1, "{json}");

        let retire = homing(&["dc", "retire", "iad", "--stores", &stores, "--yes"]).await;
        assert!(retire.status.success(), "{}", text(&retire));
        // Within the DC lease (short_lease: 2 s host leases, 4 s DC lease),
        // iad's next renewal is refused and it grants nothing more.
        let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
        loop {
            match acquire_at(&cluster, &iad, "after-retire").await {
                Err(Reply::Error(e))
                    if matches!(e.kind, ErrorKind::Unavailable { .. })
                        && e.message.contains("dc lease") =>
                {
                    break;
                }
                other => assert!(
                    tokio::time::Instant::now() < deadline,
                    "iad still answers {other:?} 30 s after retirement"
                ),
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        // Other DCs are unaffected.
        acquire_at(&cluster, &fra, "fra-goes-on").await.unwrap();
        let status = homing(&["dc", "status", "--stores", &stores]).await;
        let shown = text(&status);
        assert!(
            status.status.success() && shown.contains("retired"),
            "{shown}"
        );
        println!("{shown}");
        let refused = cluster
            .daemon(&iad)
            .restart()
            .await
            .expect_err("a retired dc was served");
        assert!(refused.contains("was retired"), "{refused}");
    })
    .await
    .expect("scenario finished in time");
}

/// One key iad held when it was killed.
struct Held {
    name: String,
    reservation: ReservationId,
    token: FencingToken,
    /// The hard stop of its holder's last grant or renewal (host clock).
    hard_stop: HostTime,
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dc_loss_a_dc_killed_for_good_has_every_key_taken_over_after_its_holders_stopped() {
    let Some(mut cluster) = start_or_skip("dc_loss", ClusterOptions::short_lease()).await else {
        return;
    };
    tokio::time::timeout(SCENARIO_TIMEOUT, async {
        let (iad, fra, sin) = (dc("iad"), dc("fra"), dc("sin"));
        let iad_host = cluster.host(&iad);
        let mut held = Vec::new();
        for i in 0..12 {
            let name = format!("lost-{i}");
            let actor = format!("10.9.1.{i}:9000");
            match cluster.ask(&iad_host, &iad, &acquire(&name, &actor)).await {
                Ok(Reply::Acquire(AcquireReply::Acquired(grant))) => held.push(Held {
                    name,
                    reservation: grant.reservation,
                    token: grant.token,
                    hard_stop: grant.deadlines.hard_terminate_at,
                }),
                other => panic!("acquire {name} at iad: {other:?}\n{}", cluster.logs()),
            }
        }
        // The holders renew (as HostAgents do) a few times: the hard stop
        // that counts is the last renewal's.
        for _ in 0..3 {
            tokio::time::sleep(Duration::from_millis(300)).await;
            for (i, h) in held.iter_mut().enumerate() {
                let renew = Request::Renew {
                    reservation: h.reservation.clone(),
                    token: h.token,
                    lease: lease_of(&format!("10.9.1.{i}:9000")),
                    host_time: host_now(),
                };
                match cluster.ask(&iad_host, &iad, &renew).await {
                    Ok(Reply::Renew(homing_core::RenewReply::Renewed(d))) => {
                        h.hard_stop = d.hard_terminate_at
                    }
                    other => panic!("renew {}: {other:?}", h.name),
                }
            }
        }
        cluster.daemon(&iad).kill();
        let killed = tokio::time::Instant::now();

        // Hosts in fra and sin keep asking for iad's keys; each is granted
        // once the global store judges iad's lease expired.
        let clients = [(fra.clone(), cluster.host(&fra)), (sin.clone(), cluster.host(&sin))];
        let mut config = cluster.resolver_config(&[&fra, &sin, &iad]);
        config.hop_timeout_ms = 300;
        let router = cluster.resolver_with(config);
        // Every key's host asks at once, each retrying every 100 ms.
        let mut acquirers = tokio::task::JoinSet::new();
        for (i, h) in held.iter().enumerate() {
            let (at, client) = clients[i % 2].clone();
            let peer = cluster.peer(&at);
            let (name, actor) = (h.name.clone(), format!("10.9.2.{i}:9000"));
            acquirers.spawn(async move {
                let mut unavailable = 0;
                loop {
                    match client.request(&peer, &acquire(&name, &actor)).await {
                        Ok(Reply::Acquire(AcquireReply::Acquired(grant))) => {
                            return (i, grant, host_now(), killed.elapsed(), unavailable);
                        }
                        Ok(Reply::Error(e)) if matches!(e.kind, ErrorKind::Unavailable { .. }) => {
                            unavailable += 1;
                        }
                        other => panic!("acquire {name} at {at} after iad died: {other:?}"),
                    }
                    tokio::time::sleep(Duration::from_millis(100)).await;
                }
            });
        }
        let mut waits = Vec::new();
        let mut unavailable_answers = 0;
        while let Some(joined) = acquirers.join_next().await {
            let (i, grant, received, waited, unavailable) = joined.expect("an acquirer finished");
            waits.push(waited);
            unavailable_answers += unavailable;
            let (h, at) = (&held[i], &clients[i % 2].0);
            let Grant { reservation, token, previous, .. } = &grant;
            assert_eq!(reservation.dc(), at, "{} granted at {at}", h.name);
            let previous = previous.as_ref().expect("the grant follows iad's run");
            assert_eq!(previous.reservation, h.reservation, "{}: taken over from iad's tail", h.name);
            assert!(*token > h.token, "{}: token {token} not above iad's {}", h.name, h.token);
            assert!(
                h.hard_stop <= received,
                "{}: iad's holder may act until {} but {at} granted it at {received}",
                h.name,
                h.hard_stop
            );
            // A router walks past the dead DC through the takeover (asking a
            // live DC for the succession), right after the grant: the new
            // holders do not renew their 2 s leases here.
            let key = homing_core::Key::new(homing_core::KeyName::new(&h.name).unwrap());
            let resolved = router
                .resolve(&key)
                .await
                .unwrap_or_else(|e| panic!("resolve {} with iad dead: {e}", h.name));
            assert_eq!(&resolved.dc, at, "{}", h.name);
            assert_eq!(resolved.actor.as_str(), format!("10.9.2.{i}:9000"));
        }
        // short_lease: 2 s host leases (hard margin 0.4 s, grace 0.5 s), a
        // 4 s DC lease; peer timeout 1 s. The store expires iad's lease 6.5 s
        // after the last renewal it received (before the kill).
        let bound = Duration::from_millis(4_000 + 2_000 + 400 + 500 + 1_000 + 1_000);
        let longest = waits.iter().max().copied().unwrap_or_default();
        let first = waits.iter().min().copied().unwrap_or_default();
        println!(
            "iad killed: first key taken over after {} ms, the last after {} ms (bound {} ms); {unavailable_answers} Unavailable answers before",
            first.as_millis(),
            longest.as_millis(),
            bound.as_millis()
        );
        assert!(longest <= bound, "the last key took {} ms, bound {} ms", longest.as_millis(), bound.as_millis());
        assert!(
            first >= Duration::from_millis(4_000),
            "a key was taken over {} ms after the kill, before iad's lease could have expired",
            first.as_millis()
        );
        // `homing dc status` says iad expired and counts its takeovers.
        let stores = cluster.store_spec();
        let (iad_row, json) = status_row(&stores, "iad").await;
        assert_eq!(iad_row["lease"], "expired", "{json}");
        assert_eq!(iad_row["taken_over"], held.len(), "{json}");
        // A second taker follows the first: the key has one holder.
        let again = cluster.ask(&clients[1].1, &sin, &acquire(&held[0].name, "10.9.3.0:9000")).await;
        match again {
            Ok(Reply::Acquire(AcquireReply::HeldElsewhere(holder))) => {
                assert_eq!(holder.reservation.dc(), &fra, "{holder:?}")
            }
            other => panic!("a second taker: {other:?}"),
        }
    })
    .await
    .expect("scenario finished in time");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dc_status_shows_each_dcs_live_leases_store_and_round_trips_and_a_killed_dc() {
    // Leases that outlive the test: the count stays put while it reads.
    let lease = LeasePolicy::new(600_000, 250, 1_000, 500, 500).expect("an ordered policy");
    let options = ClusterOptions::short_lease().with_lease(lease);
    let Some(mut cluster) = start_or_skip("dc_loss", options).await else {
        return;
    };
    tokio::time::timeout(SCENARIO_TIMEOUT, async {
        let (iad, fra, sin) = (dc("iad"), dc("fra"), dc("sin"));
        for i in 0..3 {
            acquire_at(&cluster, &iad, &format!("counted-{i}"))
                .await
                .unwrap();
        }
        acquire_at(&cluster, &fra, "counted-fra").await.unwrap();
        let stores = cluster.store_spec();
        let certs = cluster.dir().join("certs");
        let certs = certs.to_str().expect("a UTF-8 path");
        let table = [&iad, &fra, &sin]
            .iter()
            .map(|d| format!("{d}={}", cluster.addr(d)))
            .collect::<Vec<_>>()
            .join(",");
        // `homing dc status` over every DC, as JSON or as a person reads it.
        let status = |json: bool| {
            let (stores, table) = (stores.clone(), table.clone());
            async move {
                let mut args = vec!["dc", "status", "--stores", &stores, "--certs", certs];
                args.extend(["--dc", &table]);
                if json {
                    args.push("--json");
                }
                let out = homing(&args).await;
                assert!(out.status.success(), "{}", text(&out));
                out
            }
        };
        let parse = |out: Output| serde_json::from_slice::<serde_json::Value>(&out.stdout).unwrap();
        let row = |json: &serde_json::Value, dc: &DcId| {
            json["dcs"]
                .as_array()
                .unwrap()
                .iter()
                .find(|d| d["dc"] == dc.as_str())
                .cloned()
                .unwrap_or_else(|| panic!("{dc} not listed: {json}"))
        };
        // The reaper counts live leases once per pass (every 100 ms here).
        let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
        let json = loop {
            let json = parse(status(true).await);
            let counted = |dc: &DcId| row(&json, dc)["report"]["live_leases"].as_u64();
            if (counted(&iad), counted(&fra)) == (Some(3), Some(1)) {
                break json;
            }
            assert!(
                tokio::time::Instant::now() < deadline,
                "live leases never counted 3 at iad and 1 at fra: {json}"
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        };
        for d in [&iad, &fra, &sin] {
            let report = &row(&json, d)["report"];
            assert!(report["dc_store"]["ms"].is_number(), "{d}: {json}");
            assert!(report["global_store"]["ms"].is_number(), "{d}: {json}");
            for other in [&iad, &fra, &sin].into_iter().filter(|o| o != &d) {
                assert!(
                    report["round_trips"][other.as_str()]["ms"].is_number(),
                    "{d} to {other}: {json}"
                );
            }
        }
        let shown = text(&status(false).await);
        assert!(shown.contains("round trips, ms"), "{shown}");
        println!("{shown}");

        cluster.daemon(&sin).kill();
        let json = parse(status(true).await);
        let sin_row = row(&json, &sin);
        assert!(sin_row["report"].is_null(), "{json}");
        assert!(sin_row["report_error"].is_string(), "{json}");
        let to_sin = &row(&json, &iad)["report"]["round_trips"]["sin"];
        assert!(
            to_sin["error"].is_string(),
            "iad still reaches a killed sin: {json}"
        );
        let shown = text(&status(false).await);
        assert!(shown.contains("sin: no report"), "{shown}");
        assert!(shown.contains("iad: no answer from sin"), "{shown}");
    })
    .await
    .expect("scenario finished in time");
}
