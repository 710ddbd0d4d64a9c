//! `kelp mon`: create a monitor's data directory (`mkfs`) and run the monitor daemon (`run`).
//! The daemon itself is `kelp_mon::Monitor`; this module parses arguments, sets up logging,
//! the tokio runtime and signal handling.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::{Context, bail};
use clap::{Args, Subcommand};
use kelp_mon::{MkfsOptions, MonConfig, MonInfo, Monitor};
use kelp_msgr::{Keyring, generate_secret};

/// Run and manage monitors (the cluster maps, central config and auth keys, in Raft).
#[derive(Subcommand, Debug)]
pub enum MonCommand {
    /// Initialise a monitor's data directory: identity, fsid, the monitor map, the initial
    /// keyring and an empty Raft store. Run once per monitor, with the same --fsid, --mon list
    /// and keyring on every monitor of the cluster.
    Mkfs(MkfsArgs),
    /// Run a monitor from its data directory until SIGTERM or SIGINT. It listens on its own
    /// address from the monitor map; on a fresh cluster the monitor with the lowest name
    /// initialises the Raft group. Logs go to stderr (filter with RUST_LOG, default `info,openraft=warn`).
    Run(RunArgs),
}

#[derive(Args, Debug)]
pub struct MkfsArgs {
    /// This monitor's name (its entity is mon.NAME); must appear in --mon.
    #[arg(long)]
    pub id: String,
    /// Data directory to create; must not already hold a monitor.
    #[arg(long)]
    pub data: PathBuf,
    /// Cluster id (a UUID), the same on every monitor.
    #[arg(long)]
    pub fsid: String,
    /// A monitor of the cluster as NAME=IP:PORT; repeat for each monitor (this one included).
    #[arg(long = "mon", value_name = "NAME=ADDR", required = true, value_parser = parse_mon)]
    pub mons: Vec<MonInfo>,
    /// (The global -k/--keyring, required here: a keyring file in kelp-msgr format, `entity
    /// base64secret` lines, with a key for mon.NAME of every monitor and for client.admin.
    /// Copied into the data directory.)
    /// Create --keyring first (mode 0600) with fresh keys for every --mon and client.admin;
    /// fails if the file exists. Copy that file to the other monitors' mkfs.
    #[arg(long)]
    pub create_keyring: bool,
    /// CRUSH failure domain of the default rule: host (replicas on distinct hosts) or osd
    /// (single-host clusters).
    #[arg(long, default_value = "host", value_parser = ["host", "osd"])]
    pub failure_domain: String,
}

#[derive(Args, Debug)]
pub struct RunArgs {
    /// This monitor's name; must match the one given to mkfs.
    #[arg(long)]
    pub id: String,
    /// Data directory made by `kelp mon mkfs`.
    #[arg(long)]
    pub data: PathBuf,
    #[command(flatten)]
    pub metrics: crate::cmd::common::MetricsArgs,
}

fn parse_mon(s: &str) -> Result<MonInfo, String> {
    let (name, addr) = s
        .split_once('=')
        .ok_or_else(|| format!("'{s}' is not NAME=IP:PORT"))?;
    let addr: SocketAddr = addr
        .parse()
        .map_err(|e| format!("'{addr}' is not an IP:PORT address: {e}"))?;
    Ok(MonInfo {
        name: name.to_string(),
        addr,
    })
}

pub fn run(cmd: MonCommand, g: &crate::cmd::common::Global) -> anyhow::Result<ExitCode> {
    match cmd {
        MonCommand::Mkfs(a) => {
            let keyring = g
                .conf
                .keyring
                .clone()
                .context("kelp mon mkfs needs --keyring FILE (the cluster's keyring)")?;
            mkfs(a, &keyring)
        }
        MonCommand::Run(a) => run_daemon(a),
    }
}

fn mkfs(a: MkfsArgs, keyring_path: &std::path::Path) -> anyhow::Result<ExitCode> {
    if a.create_keyring {
        if keyring_path.exists() {
            bail!(
                "{} already exists; drop --create-keyring to use it",
                keyring_path.display()
            );
        }
        let mut kr = Keyring::new();
        for m in &a.mons {
            kr.insert(&format!("mon.{}", m.name), generate_secret())?;
        }
        kr.insert("client.admin", generate_secret())?;
        kr.save(keyring_path)?;
    }
    let keyring = Keyring::load(keyring_path)?;
    kelp_mon::mkfs(&MkfsOptions {
        name: a.id.clone(),
        data: a.data.clone(),
        fsid: a.fsid,
        monmap: a.mons,
        keyring,
        failure_domain: a.failure_domain,
    })
    .with_context(|| format!("mkfs of mon.{} in {}", a.id, a.data.display()))?;
    println!("created mon.{} in {}", a.id, a.data.display());
    Ok(ExitCode::SUCCESS)
}

fn run_daemon(a: RunArgs) -> anyhow::Result<ExitCode> {
    crate::cmd::common::init_logging("info,openraft=warn");
    let name = kelp_mon::monitor::data_dir_name(&a.data)?;
    if name != a.id {
        bail!(
            "{} holds monitor '{name}', not '{}'",
            a.data.display(),
            a.id
        );
    }
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .thread_name("kelp-mon")
        .build()
        .context("creating the tokio runtime")?;
    rt.block_on(async {
        let mon = Monitor::start(&a.data, MonConfig::default())
            .await
            .with_context(|| format!("starting mon.{}", a.id))?;
        let mut addrs = std::collections::BTreeMap::new();
        addrs.insert("mon".to_string(), mon.addr().to_string());
        let _metrics = a
            .metrics
            .serve(
                &format!("mon.{}", a.id),
                "mon",
                |reg| mon.register_metrics(reg),
                &mut addrs,
            )
            .await?;
        mon.set_service_addrs(addrs);
        let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
            .context("installing the SIGTERM handler")?;
        tokio::select! {
            _ = term.recv() => tracing::info!("SIGTERM: stopping"),
            r = tokio::signal::ctrl_c() => {
                r.context("waiting for SIGINT")?;
                tracing::info!("SIGINT: stopping");
            }
        }
        mon.shutdown().await;
        anyhow::Ok(())
    })?;
    Ok(ExitCode::SUCCESS)
}
