//! `homingd`: the per-DC daemon of homing.

use std::path::PathBuf;

use anyhow::Context;
use clap::Parser;
use homing_daemon::{Config, Daemon, Settings, open_stores};

/// homingd — serves one datacenter of a homing deployment.
///
/// Settings come from a TOML file (--config), overridden by HOMING_*
/// environment variables, overridden by flags. Durations are in
/// milliseconds and say so in their names. See docs/OPERATIONS.md and
/// deploy/ for examples.
#[derive(Debug, Parser)]
#[command(name = "homingd", version, about, long_about)]
struct Cli {
    /// TOML config file: the flags' names with `_` for `-`, peers as a [peers] table of dc = "addr".
    #[arg(long, env = "HOMING_CONFIG")]
    config: Option<PathBuf>,
    /// Log format: text or json.
    #[arg(long, env = "HOMING_LOG_FORMAT", default_value = "text")]
    log_format: String,
    #[command(flatten)]
    settings: Settings,
}

fn init_logs(format: &str) -> anyhow::Result<()> {
    let filter = tracing_subscriber::EnvFilter::try_from_env("HOMING_LOG")
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr);
    match format {
        "text" => builder.init(),
        "json" => builder.json().init(),
        other => anyhow::bail!("log_format: {other:?} is not text or json"),
    }
    Ok(())
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let cli = Cli::parse();
    init_logs(&cli.log_format)?;
    let file = match &cli.config {
        Some(path) => Settings::from_file(path)?,
        None => Settings::default(),
    };
    let config = Config::from_settings(file.overlay(cli.settings))?;
    let tls = config
        .tls_files()
        .load()
        .with_context(|| format!("loading TLS identity from {}", config.cert.display()))?;
    let stores = open_stores(&config).await?;
    let daemon =
        Daemon::start(&config, &tls, stores.global.clone(), stores.records.clone()).await?;
    // A line a supervisor or test can wait for.
    println!("homingd {} listening on {}", config.dc, daemon.local_addr());
    shutdown_signal().await;
    tracing::info!("shutdown requested: draining in-flight requests");
    daemon.shutdown().await;
    drop(stores);
    Ok(())
}

async fn shutdown_signal() {
    let ctrl_c = tokio::signal::ctrl_c();
    #[cfg(unix)]
    {
        let mut term =
            match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
                Ok(term) => term,
                Err(_) => return ctrl_c.await.unwrap_or(()),
            };
        tokio::select! {
            _ = ctrl_c => {}
            _ = term.recv() => {}
        }
    }
    #[cfg(not(unix))]
    let _ = ctrl_c.await;
}
