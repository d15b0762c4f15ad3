//! homingd's status page in a real browser: headless Chromium (Debian's
//! `chromium` package) loads iad's page of a running 3-DC cluster and the
//! test reads the DOM it rendered, as a person would read the page: every
//! DC listed, this DC ready and the others answering, a key's chain hop by
//! hop, the deployment part swapped in again by the page's script, and a
//! killed DC shown as unavailable within a few seconds. A screenshot is
//! kept as an artifact (`<target>/tmp/status-page.png`).
//!
//! Skips, saying why, only when Chromium is missing and `CI` is unset; in
//! CI (`.ci/run` installs it) a missing browser fails the test.

#![cfg(feature = "etcd")]

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use homing_core::{AcquireReply, Grant, LeasePolicy, ReleaseReply, Reply, Request};
use homing_e2e::cluster::{Cluster, acquire, dc, lease_of};
use homing_e2e::{ClusterOptions, start_or_skip};

/// Upper bound on the whole scenario.
const SCENARIO_TIMEOUT: Duration = Duration::from_secs(180);
/// Longest one Chromium run may take before it is killed.
const BROWSER_RUN_MAX: Duration = Duration::from_secs(60);
/// How long a killed DC may still look available on the page: "a few seconds".
const UNAVAILABLE_WITHIN: Duration = Duration::from_secs(10);
/// Virtual time the browser lets the page run before it dumps the DOM:
/// long enough for the script to fetch the deployment part twice.
const VIRTUAL_TIME_MS: u64 = 2_500;

/// The browser, or `None` (after saying why) when the test should skip.
fn chromium() -> Option<PathBuf> {
    let path = std::env::var_os("HOMING_CHROMIUM")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from("/usr/bin/chromium"));
    if path.exists() {
        return Some(path);
    }
    if std::env::var_os("CI").is_some() {
        panic!(
            "status_page: no browser at {} and CI is set: .ci/run installs Debian's chromium \
             (apt-get install -y chromium); a CI run must not skip this test",
            path.display()
        );
    }
    eprintln!(
        "SKIPPED status_page: no browser at {} (apt-get install -y chromium, or set HOMING_CHROMIUM)",
        path.display()
    );
    None
}

/// Runs headless Chromium with `args` then `url`; its stdout. Killed after
/// [`BROWSER_RUN_MAX`]; a failure panics with what it printed.
fn browse(browser: &Path, profile: &Path, args: &[String], url: &str) -> String {
    let mut child = Command::new(browser)
        .args([
            "--headless=new",
            "--disable-gpu",
            "--no-sandbox",
            "--no-first-run",
            "--disable-dev-shm-usage",
            "--hide-scrollbars",
        ])
        .arg(format!("--user-data-dir={}", profile.display()))
        .args(args)
        .arg(url)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| panic!("starting {}: {e}", browser.display()));
    let deadline = Instant::now() + BROWSER_RUN_MAX;
    loop {
        match child.try_wait().expect("the browser's status") {
            Some(_) => break,
            None if Instant::now() > deadline => {
                let _ = child.kill();
                panic!("chromium did not finish {url} within {BROWSER_RUN_MAX:?}");
            }
            None => std::thread::sleep(Duration::from_millis(50)),
        }
    }
    let output = child.wait_with_output().expect("the browser's output");
    assert!(
        output.status.success(),
        "chromium failed on {url}: {}\n{}",
        output.status,
        String::from_utf8_lossy(&output.stderr)
    );
    String::from_utf8_lossy(&output.stdout).into_owned()
}

/// The DOM Chromium rendered for `url`, after the page ran a while.
async fn rendered(browser: &Path, profile: &Path, url: String) -> String {
    let (browser, profile) = (browser.to_path_buf(), profile.to_path_buf());
    let args = vec![
        format!("--virtual-time-budget={VIRTUAL_TIME_MS}"),
        "--dump-dom".to_string(),
    ];
    tokio::task::spawn_blocking(move || browse(&browser, &profile, &args, &url))
        .await
        .expect("the browser run does not panic")
}

/// The `<tr>` of DC `name` in the rendered DCs table.
fn dc_row<'a>(dom: &'a str, name: &str) -> Option<&'a str> {
    let start = dom.find(&format!("data-dc=\"{name}\""))?;
    let end = dom[start..].find("</tr>")? + start;
    Some(&dom[start..end])
}

/// The state the page shows for DC `name` (`data-state`).
fn state_of<'a>(dom: &'a str, name: &str) -> Option<&'a str> {
    let row = dc_row(dom, name)?;
    let at = row.find("data-state=\"")? + "data-state=\"".len();
    let end = row[at..].find('"')? + at;
    Some(&row[at..end])
}

/// The number in attribute `attr` of the first element carrying it.
fn number_attr(dom: &str, attr: &str) -> Option<u64> {
    let at = dom.find(&format!("{attr}=\""))? + attr.len() + 2;
    let end = dom[at..].find('"')? + at;
    dom[at..end].parse().ok()
}

/// A plain HTTP/1.0 GET of `path` at `addr`: status line and body.
fn http_get(addr: SocketAddr, path: &str) -> String {
    let mut stream =
        TcpStream::connect_timeout(&addr, Duration::from_secs(1)).expect("the status page accepts");
    stream
        .set_read_timeout(Some(Duration::from_secs(10)))
        .expect("a read timeout");
    stream
        .write_all(format!("GET {path} HTTP/1.0\r\nHost: homingd\r\n\r\n").as_bytes())
        .expect("the request is sent");
    let mut text = String::new();
    stream
        .read_to_string(&mut text)
        .expect("the answer is read");
    text
}

/// Acquires `name` for `actor` at `at`: its grant.
async fn must_acquire(cluster: &Cluster, at: &str, name: &str, actor: &str) -> Grant {
    let at = dc(at);
    match cluster
        .ask(&cluster.host(&at), &at, &acquire(name, actor))
        .await
    {
        Ok(Reply::Acquire(AcquireReply::Acquired(grant))) => grant,
        other => panic!("acquire {name} at {at}: {other:?}\n{}", cluster.logs()),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn status_page_in_chromium_lists_every_dc_shows_a_chain_and_a_killed_dc_unavailable() {
    let Some(browser) = chromium() else { return };
    // short_lease's 1 s peer timeout (a killed DC turns suspect fast), with
    // the default 10 s host lease: the key's tail stays active, unrenewed,
    // while the pages are loaded on a slow machine.
    let options = ClusterOptions::short_lease()
        .with_lease(LeasePolicy::default())
        .with_http();
    let Some(mut cluster) = start_or_skip("status_page", options).await else {
        return;
    };
    let profile = tempfile::tempdir().expect("a browser profile dir");
    let page = format!("http://{}", cluster.http_addr(&dc("iad")));
    let scenario = async {
        // A key with a chain: reserved in iad, released, recreated in fra.
        let first = must_acquire(&cluster, "iad", "room-7", "10.0.1.7:9000").await;
        let release = Request::Release {
            lease: lease_of("10.0.1.7:9000"),
            reservation: first.reservation.clone(),
            token: first.token,
            outcome: homing_core::RunOutcome::Ok,
        };
        let released = cluster
            .ask(&cluster.host(&dc("iad")), &dc("iad"), &release)
            .await;
        assert_eq!(released.ok(), Some(Reply::Release(ReleaseReply::Released)));
        let second = must_acquire(&cluster, "fra", "room-7", "10.0.2.9:9000").await;

        // Every DC listed: iad (this page's DC) ready, fra and sin answering.
        let dom = rendered(&browser, profile.path(), format!("{page}/?key=room-7")).await;
        assert_eq!(state_of(&dom, "iad"), Some("here"), "{dom}");
        assert_eq!(state_of(&dom, "fra"), Some("available"), "{dom}");
        assert_eq!(state_of(&dom, "sin"), Some("available"), "{dom}");
        for name in ["iad", "fra", "sin"] {
            let row = dc_row(&dom, name).expect("listed");
            assert!(row.contains("live, "), "{name}'s DC lease is live: {row}");
            // Its live leases and DC store: iad's own, the others' reports.
            assert!(row.contains("healthy, "), "{name}'s DC store: {row}");
            let from = format!(r#"<tr data-from="{name}">"#);
            assert!(dom.contains(&from), "{name}'s round trips: {dom}");
        }
        // The chain, hop by hop, as `homing chain` prints it.
        let linked = format!(
            "{} (dc iad) released, linked → {}",
            first.reservation, second.reservation
        );
        assert!(dom.contains(&linked), "the link hop: {linked}\n{dom}");
        let tail = format!(
            "{} (dc fra) tail: active, actor 10.0.2.9:9000",
            second.reservation
        );
        assert!(dom.contains(&tail), "the tail hop: {tail}\n{dom}");
        // fra's live lease is listed on fra's page, with its key.
        let fra_page = format!("http://{}", cluster.http_addr(&dc("fra")));
        let fra_dom = rendered(&browser, profile.path(), fra_page).await;
        assert!(fra_dom.contains("10.0.2.9:9000"), "{fra_dom}");
        // The page's script swapped the deployment part in again.
        let loaded = number_attr(&dom, "data-loaded-seq").expect("the part as loaded");
        let shown = number_attr(&dom, "data-seq").expect("the part shown");
        assert!(
            shown > loaded,
            "refreshed without a reload: {loaded} → {shown}"
        );

        // The screenshot a person would see, kept as an artifact.
        let shot = Path::new(env!("CARGO_TARGET_TMPDIR")).join("status-page.png");
        let _ = std::fs::remove_file(&shot);
        let args = vec![
            "--window-size=1280,1100".to_string(),
            format!("--virtual-time-budget={VIRTUAL_TIME_MS}"),
            format!("--screenshot={}", shot.display()),
        ];
        let (b, p, url) = (
            browser.clone(),
            profile.path().to_path_buf(),
            format!("{page}/?key=room-7"),
        );
        tokio::task::spawn_blocking(move || browse(&b, &p, &args, &url))
            .await
            .expect("the screenshot run does not panic");
        assert!(shot.exists(), "screenshot at {}", shot.display());
        println!("status page screenshot: {}", shot.display());

        // Bad input: a clear error, never a panic.
        let bad = http_get(cluster.http_addr(&dc("iad")), "/?key=");
        assert!(
            bad.starts_with("HTTP/1.0 400") || bad.starts_with("HTTP/1.1 400"),
            "{bad}"
        );
        assert!(bad.contains("not a key"), "{bad}");
        let huge = format!("/?key={}", "k".repeat(4_000));
        let huge = http_get(cluster.http_addr(&dc("iad")), &huge);
        assert!(
            huge.contains(" 400 ") && huge.contains("longer than"),
            "{huge}"
        );

        // Kill sin: iad's page shows it unavailable within a few seconds.
        cluster.daemon(&dc("sin")).kill();
        let killed = Instant::now();
        loop {
            let dom = rendered(&browser, profile.path(), page.clone()).await;
            if state_of(&dom, "sin") == Some("unavailable") {
                let row = dc_row(&dom, "sin").expect("sin still listed");
                assert!(row.contains("unavailable:"), "says why: {row}");
                assert_eq!(state_of(&dom, "fra"), Some("available"), "{dom}");
                println!("killed sin shown unavailable after {:?}", killed.elapsed());
                break;
            }
            assert!(
                killed.elapsed() < UNAVAILABLE_WITHIN,
                "sin was killed {:?} ago and the page still shows it {:?}:\n{dom}",
                killed.elapsed(),
                state_of(&dom, "sin")
            );
        }
    };
    tokio::time::timeout(SCENARIO_TIMEOUT, scenario)
        .await
        .expect("the scenario finished within its bound");
}
