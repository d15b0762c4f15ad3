//! Losing a DC's store, and retiring a DC, on real processes (issue 20):
//! three `homingd` over a real 3-member etcd. A DC restarted under its id on
//! a wiped data dir is refused (it would hand out reservation IDs that
//! existing entries name) until started with `--start-above-floor`, which
//! continues above every ID it used. `homing dc retire` (the real CLI) stops
//! a running DC's grants within its DC lease and refuses its restart;
//! `homing dc status` shows it.

#![cfg(feature = "etcd")]

use std::process::{Command, Output};
use std::time::Duration;

use homing_core::{AcquireReply, DcId, ErrorKind, Grant, Reply, ReservationId};
use homing_e2e::cluster::{Cluster, acquire, dc};
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
        let status = homing(&["dc", "status", "--stores", &stores, "--json"]).await;
        assert!(status.status.success(), "{}", text(&status));
        let json: serde_json::Value = serde_json::from_slice(&status.stdout).unwrap();
        let iad_row = json["dcs"]
            .as_array()
            .unwrap()
            .iter()
            .find(|d| d["dc"] == "iad")
            .cloned();
        let iad_row = iad_row.unwrap_or_else(|| panic!("iad not listed: {json}"));
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
