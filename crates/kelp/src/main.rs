//! `kelp`: the single Kelp binary. Every daemon and every admin tool is a subcommand; this crate
//! only parses arguments and calls into the library crates (see `docs/ARCHITECTURE.md`).

use std::process::ExitCode;

use clap::{Parser, Subcommand};

mod cmd;

/// Every daemon and tool allocates through mimalloc. Measured on the reference VM against
/// glibc's malloc and jemalloc (docs/BENCHMARKS.md, "Allocator and OSD memory"): OSD CPU per
/// replicated 4 KiB write 0.31 ms instead of 0.37, 4 MiB writes faster, memory alike.
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

/// Kelp: a unified, self-healing distributed storage cluster (objects, blocks, files).
#[derive(Parser, Debug)]
#[command(name = "kelp", version, about, long_about = None, propagate_version = true)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand, Debug)]
enum Command {
    /// Start a whole local cluster (monitors, OSDs on files, a default pool) in one directory,
    /// creating it on first use; Ctrl-C stops it. This is how to run Kelp on one machine.
    /// The OSDs share the machine: each gets CPUs ÷ OSDs async workers and the 96 MiB store
    /// budget a new cluster's kelp.conf sets (`[osd] threads` / `cache` there change them).
    Up(cmd::up::UpArgs),
    /// Stop the cluster started with `kelp up --detach`.
    Down(cmd::up::DownArgs),
    /// Start, stop or restart one daemon of a `kelp up` cluster (e.g. `kelp daemon stop osd.2`).
    #[command(subcommand)]
    Daemon(cmd::up::DaemonCommand),
    /// CRUSH placement: test mappings, map object names to PGs and OSDs, print maps.
    #[command(subcommand)]
    Crush(cmd::crush::CrushCommand),
    /// OSD-local object store: create (mkfs), check (fsck) and benchmark a store directory.
    #[command(subcommand)]
    Store(cmd::store::StoreCommand),
    /// Monitors: create a monitor's data directory (mkfs) and run the monitor daemon (run).
    #[command(subcommand)]
    Mon(cmd::mon::MonCommand),
    /// OSDs: run an OSD daemon (run) and manage OSDs (tree, ls, out, in, down).
    #[command(subcommand)]
    Osd(cmd::osd::OsdCommand),
    /// Pools: create, ls, get, set, rm.
    #[command(subcommand)]
    Pool(cmd::pool::PoolCommand),
    /// Objects: put, get, ls, rm, stat, xattrs, omap, and the `bench` load generator.
    Rados(cmd::rados::RadosArgs),
    /// Cluster status: health, monitors, OSDs, pools and PG states.
    Status(cmd::status::StatusArgs),
    /// Cluster health (HEALTH_OK / HEALTH_WARN / HEALTH_ERR) and, with `detail`, what is wrong.
    Health(cmd::status::HealthArgs),
    /// Placement groups: `ls` with state, up and acting sets; `scrub`, `deep-scrub`, `repair`,
    /// `list-inconsistent`.
    #[command(subcommand)]
    Pg(cmd::pg::PgCommand),
    /// Central configuration kept by the monitors: set, get, rm, dump.
    #[command(subcommand)]
    Config(cmd::config::ConfigCommand),
    /// The S3 gateway daemon: a stateless S3 service on the cluster (run as many as you like).
    Rgw(cmd::rgw::RgwArgs),
    /// S3 administration (users, keys, buckets, garbage collection).
    #[command(subcommand)]
    S3(cmd::rgw::S3Command),
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    // SIGPIPE stays ignored (Rust's default) in every command: a peer closing a socket (an
    // OSD restarting, a gateway answering an upload early with an error) must be an error to
    // handle, not a silent death with status 141. Only a closed *stdout* ends a command the
    // way it ends other Unix tools (`kelp rados ls | head`): printing to it then panics with
    // a broken pipe, and this hook turns that into death by SIGPIPE, without a message.
    let default_hook = std::panic::take_hook();
    std::panic::set_hook(Box::new(move |info| {
        let payload = info.payload();
        let msg = payload
            .downcast_ref::<String>()
            .map(String::as_str)
            .or_else(|| payload.downcast_ref::<&str>().copied())
            .unwrap_or("");
        if msg.starts_with("failed printing to stdout") && msg.contains("Broken pipe") {
            // SAFETY: plain libc calls; the process is meant to end here.
            unsafe {
                libc::signal(libc::SIGPIPE, libc::SIG_DFL);
                libc::raise(libc::SIGPIPE);
            }
        }
        default_hook(info);
    }));
    let result = match cli.command {
        Command::Up(a) => cmd::up::run_up(a),
        Command::Rgw(a) => cmd::rgw::run_gateway(a),
        Command::S3(c) => cmd::rgw::run_admin(c),
        Command::Down(a) => cmd::up::run_down(a),
        Command::Daemon(c) => cmd::up::run_daemon(c),
        Command::Crush(c) => cmd::crush::run(c),
        Command::Store(c) => cmd::store::run(c),
        Command::Mon(c) => cmd::mon::run(c),
        Command::Osd(c) => cmd::osd::run(c),
        Command::Pool(c) => cmd::pool::run(c),
        Command::Rados(a) => cmd::rados::run(a),
        Command::Status(a) => cmd::status::run_status(a),
        Command::Health(a) => cmd::status::run_health(a),
        Command::Pg(c) => cmd::pg::run_pg(c),
        Command::Config(c) => cmd::config::run(c),
    };
    match result {
        Ok(code) => code,
        Err(err) => {
            eprintln!("kelp: error: {err:#}");
            ExitCode::from(1)
        }
    }
}
