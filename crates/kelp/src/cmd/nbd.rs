//! `kelp nbd`: the NBD server exporting block images (`kelp rbd`) to NBD clients (qemu,
//! libnbd's nbdcopy/nbdinfo/nbdfuse, fio's nbd engine, the kernel's nbd-client).

use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context, Result};
use clap::Args;
use kelp_nbd::{NbdServer, RbdExports, ServerConfig};
use kelp_rbd::Rbd;

use crate::cmd::common;

/// NBD's registered port.
pub const DEFAULT_PORT: u16 = 10809;

#[derive(Args, Debug)]
pub struct NbdArgs {
    /// TCP address to serve on (0.0.0.0:10809 to serve other machines; port 0: any free port,
    /// written to DIR/addr with --data).
    #[arg(long, default_value = "127.0.0.1:10809")]
    pub bind: SocketAddr,
    /// Also serve on this Unix socket (e.g. nbd+unix:///rbd/disk?socket=PATH).
    #[arg(long, value_name = "PATH")]
    pub socket: Option<PathBuf>,
    /// Pool of export names without one (`IMAGE` is `POOL/IMAGE`); also the pool listed to
    /// clients that ask (NBD_OPT_LIST).
    #[arg(long, default_value = crate::cmd::rbd::DEFAULT_POOL)]
    pub pool: String,
    /// Most client connections at once (more are turned away).
    #[arg(long, default_value_t = 128)]
    pub max_connections: usize,
    /// Directory where the server writes `addr` (where it listens) once it serves, and its
    /// pid file.
    #[arg(long)]
    pub data: Option<PathBuf>,
    /// If the --bind port is taken, listen on a free port of the same address instead (and
    /// say so); `kelp up` uses this and reads the address from DIR/addr.
    #[arg(long)]
    pub any_port_if_taken: bool,
    /// This server's name in the service map (`kelp daemon ls` shows it as nbd.ID). Default:
    /// the address it serves on.
    #[arg(long)]
    pub id: Option<String>,
    #[command(flatten)]
    pub metrics: common::MetricsArgs,
    /// Async worker threads (default: one per CPU). With one, the requests that become ready
    /// together are sent to the OSDs in one socket write.
    #[arg(long)]
    pub threads: Option<usize>,
}

pub fn run(a: NbdArgs, g: &crate::cmd::common::Global) -> Result<ExitCode> {
    common::init_logging("info");
    let rt = common::runtime_with_threads(a.threads)?;
    rt.block_on(async {
        let rados = g.conf.connect().await?;
        let exports = Arc::new(RbdExports::new(Rbd::new(rados.clone()), &a.pool));
        let server = Arc::new(NbdServer::new(
            exports,
            ServerConfig {
                max_connections: a.max_connections,
                shutdown_grace: Duration::from_secs(10),
                ..ServerConfig::default()
            },
        ));
        let listener = match tokio::net::TcpListener::bind(a.bind).await {
            Ok(l) => l,
            Err(e) if e.kind() == std::io::ErrorKind::AddrInUse && a.any_port_if_taken => {
                let any = SocketAddr::new(a.bind.ip(), 0);
                let l = tokio::net::TcpListener::bind(any)
                    .await
                    .with_context(|| format!("cannot listen on {any}"))?;
                eprintln!(
                    "kelp nbd: {} is taken; listening on {} instead",
                    a.bind,
                    l.local_addr()?
                );
                l
            }
            Err(e) => return Err(e).with_context(|| format!("cannot listen on {}", a.bind)),
        };
        let local = listener.local_addr()?;
        let unix = match &a.socket {
            Some(path) => {
                let _ = std::fs::remove_file(path);
                Some(
                    tokio::net::UnixListener::bind(path)
                        .with_context(|| format!("cannot listen on {}", path.display()))?,
                )
            }
            None => None,
        };
        if let Some(dir) = &a.data {
            std::fs::create_dir_all(dir)?;
            common::write_pid_file(&dir.join("pid"))?;
            let tmp = dir.join("addr.tmp");
            std::fs::write(&tmp, format!("{local}\n"))?;
            std::fs::rename(&tmp, dir.join("addr"))?;
        }
        eprintln!("kelp nbd: serving images on nbd://{local}/{}/IMAGE", a.pool);
        let name = format!("nbd.{}", a.id.clone().unwrap_or_else(|| local.to_string()));
        let mut addrs = std::collections::BTreeMap::new();
        addrs.insert("nbd".to_string(), format!("nbd://{local}"));
        let _metrics = a
            .metrics
            .serve(
                &name,
                "nbd",
                |reg| {
                    server.metrics().register(reg);
                    common::register_msgr(reg, rados.messengers());
                },
                &mut addrs,
            )
            .await?;
        let beacons = rados.spawn_service_beacons(name, "nbd".into(), addrs);
        let (stop_tx, stop_rx) = tokio::sync::watch::channel(false);
        let stopped = |mut rx: tokio::sync::watch::Receiver<bool>| async move {
            let _ = rx.wait_for(|s| *s).await;
        };
        let tcp = {
            let server = server.clone();
            let rx = stop_rx.clone();
            tokio::spawn(async move { server.serve_tcp(listener, stopped(rx)).await })
        };
        let sock = unix.map(|l| {
            let server = server.clone();
            let rx = stop_rx.clone();
            tokio::spawn(async move { server.serve_unix(l, stopped(rx)).await })
        });
        common::shutdown_signal().await;
        beacons.abort();
        let _ = stop_tx.send(true);
        tcp.await?.context("serving NBD over TCP")?;
        if let Some(s) = sock {
            s.await?.context("serving NBD on the Unix socket")?;
        }
        if let Some(path) = &a.socket {
            let _ = std::fs::remove_file(path);
        }
        eprintln!("kelp nbd: stopped");
        Ok(ExitCode::SUCCESS)
    })
}
