//! What the cluster commands share: finding `kelp.conf`, connecting as `client.admin`, the
//! tokio runtime, logging, signals.

use std::path::PathBuf;

use anyhow::{Context, Result};
use clap::Args;
use kelp_client::{ClientConfig, Rados};

use crate::cmd::OutputFormat;

/// The options every command takes, before or after the subcommand, in Ceph's places
/// (`kelp -c F status` and `kelp status -c F` are the same).
#[derive(Args, Debug, Clone, Default)]
pub struct Global {
    #[command(flatten)]
    pub conf: ConfArgs,
    /// Output format of commands that can print machine-readable results.
    #[arg(
        short = 'f',
        long = "format",
        value_enum,
        default_value_t,
        global = true,
        value_name = "FORMAT"
    )]
    pub format: OutputFormat,
}

/// Where the cluster configuration is, and who to authenticate as.
#[derive(Args, Debug, Clone, Default)]
pub struct ConfArgs {
    /// Cluster configuration file written by `kelp up` (default: $KELP_CONF, else
    /// CLUSTER/kelp.conf with --cluster, else ./kelp-data/kelp.conf).
    #[arg(
        short = 'c',
        long = "conf",
        env = "KELP_CONF",
        value_name = "CONF",
        global = true
    )]
    pub conf: Option<PathBuf>,
    /// Directory of a `kelp up` cluster: its kelp.conf is the configuration, and it is the
    /// default of `--dir` for `kelp up`, `kelp down` and `kelp daemon` (default ./kelp-data).
    #[arg(
        long = "cluster",
        env = "KELP_CLUSTER",
        value_name = "DIR",
        global = true
    )]
    pub cluster: Option<PathBuf>,
    /// Entity to authenticate as (its key must be in the keyring).
    #[arg(
        long = "name",
        value_name = "ENTITY",
        default_value = "client.admin",
        global = true
    )]
    pub entity: String,
    /// Keyring file to take the entity's key from (default: the one the configuration names).
    #[arg(short = 'k', long = "keyring", value_name = "KEYRING", global = true)]
    pub keyring: Option<PathBuf>,
}

/// The directory of a `kelp up` cluster when none is given.
pub const DEFAULT_CLUSTER_DIR: &str = "kelp-data";

impl ConfArgs {
    /// The configuration of the cluster in `dir` (as `kelp up` lays it out).
    pub fn for_dir(dir: &std::path::Path) -> ConfArgs {
        ConfArgs {
            conf: Some(dir.join("kelp.conf")),
            entity: "client.admin".into(),
            ..ConfArgs::default()
        }
    }

    /// The cluster directory: `dir` if given, else --cluster, else ./kelp-data.
    pub fn cluster_dir(&self, dir: Option<&std::path::Path>) -> PathBuf {
        dir.map(PathBuf::from)
            .or_else(|| self.cluster.clone())
            .unwrap_or_else(|| PathBuf::from(DEFAULT_CLUSTER_DIR))
    }

    pub fn path(&self) -> PathBuf {
        self.conf
            .clone()
            .unwrap_or_else(|| self.cluster_dir(None).join("kelp.conf"))
    }

    pub fn client_config(&self) -> Result<ClientConfig> {
        let path = self.path();
        ClientConfig::from_conf_file_with_keyring(&path, &self.entity, self.keyring.as_deref())
            .with_context(|| {
                format!(
                    "cannot use cluster configuration {} (start a cluster with `kelp up`, or pass -c)",
                    path.display()
                )
            })
    }

    pub async fn connect(&self) -> Result<Rados> {
        let cfg = self.client_config()?;
        let mons = cfg.mons.clone();
        Rados::connect(cfg)
            .await
            .with_context(|| format!("cannot connect to the monitors at {mons:?}"))
    }
}

/// A multi-threaded runtime for one command.
pub fn runtime() -> Result<tokio::runtime::Runtime> {
    runtime_with_threads(None)
}

/// A multi-threaded runtime with `threads` workers (`None`: one per CPU).
pub fn runtime_with_threads(threads: Option<usize>) -> Result<tokio::runtime::Runtime> {
    let mut b = tokio::runtime::Builder::new_multi_thread();
    if let Some(n) = threads {
        b.worker_threads(n.max(1));
    }
    b.enable_all()
        .build()
        .context("cannot start the async runtime")
}

/// Logs to stderr, filtered by RUST_LOG (default `info` for daemons).
pub fn init_logging(default: &str) {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new(default));
    use std::io::IsTerminal;
    let _ = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_ansi(std::io::stderr().is_terminal())
        .try_init();
}

/// Resolves on SIGTERM or SIGINT.
pub async fn shutdown_signal() {
    use tokio::signal::unix::{SignalKind, signal};
    let term = signal(SignalKind::terminate());
    let int = signal(SignalKind::interrupt());
    match (term, int) {
        (Ok(mut t), Ok(mut i)) => {
            tokio::select! {
                _ = t.recv() => {}
                _ = i.recv() => {}
            }
        }
        _ => {
            let _ = tokio::signal::ctrl_c().await;
        }
    }
}

/// Writes this process's pid into `path` (creating its folder), replaced atomically.
pub fn write_pid_file(path: &std::path::Path) -> Result<()> {
    write_pid_file_for(path, std::process::id())
}

/// Writes `pid` into `path` (creating its folder), replaced atomically.
pub fn write_pid_file_for(path: &std::path::Path, pid: u32) -> Result<()> {
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    }
    let tmp = path.with_extension("pid.tmp");
    std::fs::write(&tmp, format!("{pid}\n"))
        .with_context(|| format!("writing {}", tmp.display()))?;
    std::fs::rename(&tmp, path).with_context(|| format!("writing {}", path.display()))?;
    Ok(())
}

/// Every few seconds, hands the allocator's free memory back to the system (call inside a tokio
/// runtime). The daemons' large allocations are payloads in flight: a gateway's body stripes
/// (4 MiB, read in 2 MiB pieces), an OSD's received 4 MiB writes and read replies; glibc keeps
/// freed ones in its heaps, so after 16 uploads of 32 MiB objects the gateway kept 321 MiB
/// resident although idle. Making glibc map and unmap each such buffer instead (a fixed mmap
/// threshold) returned it at once but cost 50% more CPU on large GETs (page faults), so the
/// heaps are trimmed in the background instead.
#[cfg(all(target_os = "linux", target_env = "gnu"))]
pub fn trim_heap_periodically() {
    tokio::spawn(async {
        let mut tick = tokio::time::interval(std::time::Duration::from_secs(5));
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tick.tick().await;
            // SAFETY: malloc_trim only returns free heap pages to the system.
            let _ = tokio::task::spawn_blocking(|| unsafe { libc::malloc_trim(0) }).await;
        }
    });
}

/// Other C libraries have no `malloc_trim` (and different heaps): nothing to do.
#[cfg(not(all(target_os = "linux", target_env = "gnu")))]
pub fn trim_heap_periodically() {}

/// `--metrics-addr` / `--no-metrics`, taken by every daemon.
#[derive(clap::Args, Debug, Clone)]
pub struct MetricsArgs {
    /// Serve Prometheus metrics at http://HOST:PORT/metrics (port 0: any free port). The
    /// daemon logs the address it chose and announces it in the service map (`kelp daemon
    /// ls`), where Prometheus can find it (docs/METRICS.md).
    #[arg(long, value_name = "HOST:PORT", default_value = "127.0.0.1:0")]
    pub metrics_addr: std::net::SocketAddr,
    /// Serve no metrics endpoint (and send no service-map beacon).
    #[arg(long)]
    pub no_metrics: bool,
}

/// Adds the messenger metrics of `msgrs` (summed) to a daemon's registry: a daemon built on a
/// RADOS client passes `Rados::messengers`, plus its own listening messenger if it has one.
pub fn register_msgr(reg: &mut kelp_metrics::Registry, msgrs: Vec<kelp_msgr::Messenger>) {
    reg.register_msgr(move || kelp_msgr::metrics_counts(&msgrs));
}

impl MetricsArgs {
    /// Where to serve metrics, if at all.
    pub fn addr(&self) -> Option<std::net::SocketAddr> {
        (!self.no_metrics).then_some(self.metrics_addr)
    }

    /// Starts the daemon's metrics endpoint (unless metrics are off): the common process and
    /// daemon series of `daemon` (of kind `kind`) plus what `register` adds. Logs its URL and
    /// records it as `metrics` in `addrs`, the daemon's addresses in the service map.
    pub async fn serve(
        &self,
        daemon: &str,
        kind: &str,
        register: impl FnOnce(&mut kelp_metrics::Registry),
        addrs: &mut std::collections::BTreeMap<String, String>,
    ) -> Result<Option<kelp_metrics::MetricsServer>> {
        let Some(at) = self.addr() else {
            return Ok(None);
        };
        let mut reg = kelp_metrics::Registry::new();
        reg.register_common(daemon, kind);
        register(&mut reg);
        let server = kelp_metrics::serve(at, std::sync::Arc::new(reg))
            .await
            .context("starting the metrics endpoint")?;
        tracing::info!(url = %server.url(), "metrics endpoint");
        addrs.insert("metrics".to_string(), server.url());
        Ok(Some(server))
    }
}
