//! The `homing` command's exit codes and output, end to end: the real binary
//! against a real `homingd` (one DC, redb). Scripts tell ok (0), refused
//! (77), not found (3), unavailable (69), held elsewhere (75) and bad input
//! (2) apart, read human sentences (never a Debug struct) or `--json`.

#![cfg(feature = "etcd")]

use std::process::{Command, Output};
use std::time::Duration;

use homing_core::LeasePolicy;
use homing_e2e::cluster::free_udp_addr;
use homing_e2e::homing_binary;
use homing_e2e::lone_dc::LoneDc;
use serde_json::Value;

/// Longest one `homing` invocation may take.
const RUN_TIMEOUT: Duration = Duration::from_secs(30);

struct Run {
    code: i32,
    stdout: String,
    stderr: String,
}

/// Runs `homing ARGS` against `dc`.
async fn homing(dc: &LoneDc, args: &[&str]) -> Run {
    let mut command = Command::new(homing_binary());
    command
        .args(args)
        .env("HOMING_CERTS", dc.certs_dir())
        .env("HOMING_DCS", format!("iad={}", dc.addr()));
    let output: Output = tokio::time::timeout(
        RUN_TIMEOUT,
        tokio::task::spawn_blocking(move || command.output()),
    )
    .await
    .expect("homing finished in time")
    .unwrap()
    .expect("homing ran");
    let run = Run {
        code: output.status.code().expect("exited, not killed"),
        stdout: String::from_utf8_lossy(&output.stdout).into_owned(),
        stderr: String::from_utf8_lossy(&output.stderr).into_owned(),
    };
    for text in [&run.stdout, &run.stderr] {
        assert!(
            !text.contains(" { ") && !text.contains("Token("),
            "Debug output from homing {args:?}: {text}"
        );
    }
    run
}

fn json(run: &Run) -> Value {
    serde_json::from_str(run.stdout.trim()).unwrap_or_else(|e| panic!("{e}: {}", run.stdout))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cli_exit_codes_tell_ok_refused_not_found_unavailable_and_bad_input_apart() {
    let dc = LoneDc::start(LeasePolicy::DEFAULT, &[]).await;

    // Not found: a key never reserved, in words and in JSON.
    let absent = homing(&dc, &["resolve", "nobody"]).await;
    assert_eq!(absent.code, 3, "{}", absent.stderr);
    assert!(absent.stderr.contains("not found"), "{}", absent.stderr);
    let absent = homing(&dc, &["resolve", "nobody", "--json"]).await;
    assert_eq!(absent.code, 3);
    assert_eq!(json(&absent)["outcome"], "not_found");

    // Ok: reserve, then resolve it.
    let reserved = homing(&dc, &["reserve", "room", "--actor", "10.0.0.1:1", "--json"]).await;
    assert_eq!(reserved.code, 0, "{}", reserved.stderr);
    let grant = json(&reserved);
    assert_eq!(grant["outcome"], "acquired");
    let reservation = grant["reservation"].as_str().unwrap().to_string();
    let token = grant["token"].as_u64().unwrap();
    let resolved = homing(&dc, &["resolve", "room", "--json"]).await;
    assert_eq!(resolved.code, 0, "{}", resolved.stderr);
    assert_eq!(json(&resolved)["reservation"], reservation.as_str());

    // Held elsewhere: another actor asks for it.
    let held = homing(&dc, &["reserve", "room", "--actor", "10.0.0.2:2"]).await;
    assert_eq!(held.code, 75, "{}", held.stderr);
    assert!(
        held.stdout.contains("is held by actor 10.0.0.1:1"),
        "{}",
        held.stdout
    );

    // Refused: a release with a token that is not the holder's.
    let wrong = (token + 98).to_string();
    let stale = homing(&dc, &["release", &reservation, "--token", &wrong]).await;
    assert_eq!(stale.code, 77, "{}", stale.stderr);
    assert!(
        stale
            .stderr
            .contains(&format!("held under token {token}, not {wrong}")),
        "{}",
        stale.stderr
    );
    let stale = homing(&dc, &["release", &reservation, "--token", &wrong, "--json"]).await;
    assert_eq!(json(&stale)["outcome"], "refused");

    // Bad input: nothing is sent.
    let too_long = "k".repeat(100_000);
    for args in [
        &["release", "not-a-reservation", "--token", "1"][..],
        &["resolve", &too_long][..],
        &["resolve", "room", "--namespace", "\u{7}"][..],
        &["reserve", "room", "--actor", "a", "--wait-ms", "999999999"][..],
        &["release", &reservation][..],
    ] {
        let bad = homing(&dc, args).await;
        assert_eq!(bad.code, 2, "{args:?}: {}", bad.stderr);
    }

    // Ok: the holder's token releases it.
    let ok = homing(
        &dc,
        &["release", &reservation, "--token", &token.to_string()],
    )
    .await;
    assert_eq!(ok.code, 0, "{}", ok.stderr);
    assert!(ok.stdout.contains("released"), "{}", ok.stdout);

    // Unavailable: a DC that does not answer (a port nobody serves).
    let mut command = Command::new(homing_binary());
    command
        .args(["resolve", "room", "--json"])
        .env("HOMING_CERTS", dc.certs_dir())
        .env("HOMING_DCS", format!("iad={}", free_udp_addr()));
    let output = tokio::time::timeout(
        RUN_TIMEOUT,
        tokio::task::spawn_blocking(move || command.output()),
    )
    .await
    .expect("homing finished in time")
    .unwrap()
    .unwrap();
    assert_eq!(
        output.status.code(),
        Some(69),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
    let silent: Value = serde_json::from_slice(&output.stdout).unwrap();
    assert_eq!(silent["outcome"], "unavailable");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cli_help_documents_the_exit_codes() {
    let dc = LoneDc::start(LeasePolicy::DEFAULT, &[]).await;
    for args in [&["--help"][..], &["release", "--help"][..]] {
        let help = homing(&dc, args).await;
        assert_eq!(help.code, 0);
        for line in [
            "  3   not found",
            "  69  unavailable",
            "  77  refused",
            "  2   bad input",
        ] {
            assert!(help.stdout.contains(line), "{args:?} lacks {line:?}");
        }
    }
}
