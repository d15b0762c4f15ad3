//! The deployment version (issue 51) on a running 3-DC deployment, through
//! the real `homing` binary: it is raised only when every homingd listed in
//! the DC directory speaks the new version (a listed homingd that does not
//! answer blocks it, until an operator takes it out of the directory),
//! lowered again while nothing was written in its form, never lowered
//! after, and a homingd refuses to start in a deployment whose version is
//! newer than it speaks.

#![cfg(feature = "etcd")]

use std::process::Command;
use std::time::Duration;

use homing_core::wire::{PROTOCOL_VERSION, PROTOCOL_VERSION_OLDEST};
use homing_e2e::cluster::{dc, free_udp_addr};
use homing_e2e::{ClusterOptions, homing_binary, start_or_skip};
use homing_store::GlobalStore;
use homing_store::deployment::{self, DeploymentVersion};
use homing_store::setting::Setting;
use serde_json::Value;

/// Upper bound on the scenario, so a hang fails instead of stalling CI.
const SCENARIO_TIMEOUT: Duration = Duration::from_secs(90);
/// Longest wait for the daemons to list themselves.
const EVENT_WAIT: Duration = Duration::from_secs(20);

/// `homing dc version --json ARGS` on the cluster's stores: exit code and
/// the JSON it printed.
fn version(stores: &str, certs: &std::path::Path, args: &[&str]) -> (i32, Value) {
    let output = Command::new(homing_binary())
        .args(["dc", "version", "--json", "--stores", stores, "--certs"])
        .arg(certs)
        .args(args)
        .output()
        .expect("homing runs");
    let text = String::from_utf8_lossy(&output.stdout);
    let json = serde_json::from_str(text.trim())
        .unwrap_or_else(|e| panic!("{e}: {text} / {}", String::from_utf8_lossy(&output.stderr)));
    (output.status.code().expect("exited"), json)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_deployment_version_is_raised_only_when_every_homingd_speaks_it_and_lowered_only_before_use()
 {
    let Some(mut cluster) = start_or_skip("deployment_version", ClusterOptions::default()).await
    else {
        return;
    };
    let stores = cluster.store_spec();
    let certs = cluster.dir().join("certs");
    let global = cluster.global_store().await;
    let scenario = async {
        // The three homingd list themselves at start.
        cluster.wait_listed(EVENT_WAIT).await;
        let (code, shown) = version(&stores, &certs, &[]);
        assert_eq!(
            (code, shown["version"].as_u64()),
            (0, Some(u64::from(PROTOCOL_VERSION_OLDEST)))
        );

        // A listed homingd that does not answer (gone, not yet removed).
        let gone = free_udp_addr();
        homing_store::directory::update(&global, |d| d.with(&dc("iad"), gone))
            .await
            .unwrap();
        let (code, refused) = version(&stores, &certs, &["--raise"]);
        assert_eq!(code, 77, "{refused}");
        let error = refused["error"].as_str().unwrap_or_default();
        assert!(
            error.contains(&gone.to_string()) && error.contains("did not answer"),
            "{error}"
        );
        assert_eq!(
            deployment::read(&global).await.unwrap().version,
            PROTOCOL_VERSION_OLDEST
        );

        let removed = Command::new(homing_binary())
            .args(["dc", "directory", "--stores", &stores, "--remove"])
            .arg(format!("iad={gone}"))
            .output()
            .expect("homing runs");
        assert!(removed.status.success(), "{removed:?}");
        let (code, raised) = version(&stores, &certs, &["--raise"]);
        assert_eq!(
            (code, raised["version"].as_u64()),
            (0, Some(u64::from(PROTOCOL_VERSION_OLDEST + 1))),
            "{raised}"
        );

        // A rollback before anything was written in the new form.
        let (code, lowered) = version(&stores, &certs, &["--lower"]);
        assert_eq!(
            (code, lowered["version"].as_u64()),
            (0, Some(u64::from(PROTOCOL_VERSION_OLDEST)))
        );
        // One version at a time, up to this release's.
        for to in PROTOCOL_VERSION_OLDEST + 1..=PROTOCOL_VERSION {
            let (code, raised) = version(&stores, &certs, &["--raise"]);
            assert_eq!((code, raised["version"].as_u64()), (0, Some(u64::from(to))));
        }
        let (code, _) = version(&stores, &certs, &["--raise"]);
        assert_ne!(code, 0, "raised past what this release speaks");
        deployment::note_new_form_written(&global, PROTOCOL_VERSION)
            .await
            .unwrap();
        let (code, kept) = version(&stores, &certs, &["--lower"]);
        assert_eq!(code, 77, "{kept}");
        assert_eq!(
            deployment::read(&global).await.unwrap().version,
            PROTOCOL_VERSION
        );

        // A deployment raised past this release (as the next release will):
        // this release's homingd refuses to start.
        let held = global.setting(Setting::DeploymentVersion).await.unwrap();
        let next = DeploymentVersion {
            version: PROTOCOL_VERSION + 1,
            new_form_written: false,
        };
        let bytes = homing_core::wire::encode(&next).unwrap();
        global
            .swap_setting(Setting::DeploymentVersion, held.as_deref(), &bytes)
            .await
            .unwrap()
            .unwrap();
        let refused = cluster.daemon(&dc("fra")).restart().await;
        let log = refused.expect_err("an outdated homingd refuses to start");
        assert!(
            log.contains(&format!(
                "the deployment version is {}",
                PROTOCOL_VERSION + 1
            )),
            "{log}"
        );
    };
    if tokio::time::timeout(SCENARIO_TIMEOUT, scenario)
        .await
        .is_err()
    {
        panic!(
            "the scenario did not end within {SCENARIO_TIMEOUT:?}; daemon logs:\n{}",
            cluster.logs()
        );
    }
}
