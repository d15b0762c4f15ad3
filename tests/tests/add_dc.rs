//! A DC added to a running deployment (issue 51): three `homingd` over a
//! 3-member etcd and an `edge-router` configured with those three are
//! running; a fourth DC's homingd starts with no peer configured. Nothing
//! else is restarted or reconfigured:
//!
//! 1. The new homingd lists itself in the DC directory; the router learns
//!    it from a DC it knows (its log says so).
//! 2. An `actor-host` reserves a new key at the new DC, and a user's request
//!    through the already running router reaches it.
//! 3. The actor stops (releasing the key), and another `actor-host`
//!    reserves the key at fra: fra links the new DC's tail, which it can
//!    only do if it learned the new DC as a peer, and the router follows the
//!    chain from the new DC to fra.
//! 4. `homing dc directory` lists all four DCs.
//!
//! Every wait is on an event (a log line, a process's word, a response)
//! with a deadline; every process is killed on the way out.

#![cfg(feature = "etcd")]

use std::process::Command;
use std::time::{Duration, Instant};

use homing_e2e::cluster::{SPARE_DC, dc};
use homing_e2e::edge::{ActorHostProcess, EdgeRouterProcess, http_get};
use homing_e2e::{ClusterOptions, homing_binary, start_or_skip};
use rustix::process::{Pid, Signal};

/// Upper bound on the scenario, so a hang fails instead of stalling CI.
const SCENARIO_TIMEOUT: Duration = Duration::from_secs(90);
/// How often DCs and the router read the directory in this test.
const REFRESH_MS: u64 = 300;
/// Longest wait for any one event.
const EVENT_WAIT: Duration = Duration::from_secs(20);
/// Bound on one user request.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(10);

/// GETs `path` through the router until the answer is a 200 whose body
/// names `actor`, within [`EVENT_WAIT`] (the router's cached answer of an
/// earlier holder lives one tail TTL); the last answer otherwise.
async fn until_served_by(
    router: &EdgeRouterProcess,
    path: &str,
    actor: &str,
) -> Result<(), String> {
    let deadline = Instant::now() + EVENT_WAIT;
    loop {
        let answer = http_get(router.addr, path, REQUEST_TIMEOUT).await?;
        if answer.status == 200 && answer.body.contains(actor) {
            return Ok(());
        }
        if Instant::now() >= deadline {
            return Err(format!(
                "no 200 from {actor} within {EVENT_WAIT:?}; last: {} {:?}",
                answer.status, answer.body
            ));
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dc_added_to_a_running_deployment_serves_reserves_routed_by_a_running_router() {
    let refresh = format!("--directory-refresh-ms={REFRESH_MS}");
    let options = ClusterOptions::default().with_arg(&refresh);
    let Some(mut cluster) = start_or_skip("add_dc", options).await else {
        return;
    };
    let (iad, fra, sin, syd) = (dc("iad"), dc("fra"), dc("sin"), dc(SPARE_DC));
    let scenario = async {
        let router = EdgeRouterProcess::start(&cluster, &[&iad, &fra, &sin], &[&refresh])
            .await
            .expect("the router starts");
        let since = Instant::now();
        cluster
            .add_dc(&syd)
            .await
            .expect("the new dc's homingd starts");
        let learned = format!("learned from the dc directory dc={syd}");
        router
            .process
            .wait_for(&learned, since, EVENT_WAIT)
            .await
            .expect("the running router learns the new dc");

        let first = ActorHostProcess::start(&cluster, &syd, "room-new")
            .await
            .expect("a host reserves a key at the new dc");
        until_served_by(&router, "/k/room-new/hello", &first.actor)
            .await
            .expect("the router routes to the new dc's actor");

        let released = Instant::now();
        let pid = Pid::from_raw(first.process.pid() as i32).expect("a child's pid");
        rustix::process::kill_process(pid, Signal::INT).expect("SIGINT to the actor host");
        first
            .process
            .wait_for("released", released, EVENT_WAIT)
            .await
            .expect("the actor host releases the key");
        let second = ActorHostProcess::start(&cluster, &fra, "room-new")
            .await
            .expect("fra takes the key over from the new dc (it learned it as a peer)");
        until_served_by(&router, "/k/room-new/hello", &second.actor)
            .await
            .expect("the router follows the chain from the new dc to fra");

        let listed = Command::new(homing_binary())
            .args(["dc", "directory", "--json", "--stores"])
            .arg(cluster.store_spec())
            .output()
            .expect("homing runs");
        let text = String::from_utf8_lossy(&listed.stdout);
        assert!(listed.status.success(), "homing dc directory: {text}");
        for d in [&iad, &fra, &sin, &syd] {
            assert!(
                text.contains(&format!("\"dc\":\"{d}\"")),
                "{d} listed: {text}"
            );
        }
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
