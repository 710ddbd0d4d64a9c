//! `kelp`: the single Kelp binary. Every daemon and every admin tool is a subcommand; this crate
//! only parses arguments and calls into the library crates (see `docs/ARCHITECTURE.md`).

use std::process::ExitCode;

use clap::{CommandFactory, Parser, Subcommand};

mod cmd;

/// Every daemon and tool allocates through mimalloc. Measured on the reference VM against
/// glibc's malloc and jemalloc (docs/benchmarks/memory.md): OSD CPU per
/// replicated 4 KiB write 0.31 ms instead of 0.37, 4 MiB writes faster, memory alike.
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

/// Turns transparent huge pages off for this process (and the daemons it starts). mimalloc
/// asks for them on its arenas, and every time it hands back memory it has freed and then
/// takes it again, the kernel faults in and zeroes a whole 2 MiB page: in an OSD under a
/// stream of small writes that zeroing (`clear_page_erms`) was ~6 % of its samples, and an
/// untar of 10 000 files took 11 % longer with them (docs/BENCHMARKS.md, 2026-11-28).
/// (A kernel without the option refuses it, and huge pages stay as the system sets them.)
fn no_transparent_huge_pages() {
    // SAFETY: PR_SET_THP_DISABLE takes plain integers and only sets a flag of this process.
    unsafe { libc::prctl(libc::PR_SET_THP_DISABLE, 1, 0, 0, 0) };
}

/// Kelp: a unified, self-healing distributed storage cluster (objects, blocks, files).
///
/// The options below (-c, --cluster, --name, -k, -f) go before or after the subcommand, as
/// with Ceph's tools: `kelp -c DIR/kelp.conf status` and `kelp status -c DIR/kelp.conf` are
/// the same. `kelp -s` is `kelp status`, `kelp -w` is `kelp watch`.
#[derive(Parser, Debug)]
#[command(name = "kelp", version, about, long_about, propagate_version = true)]
struct Cli {
    #[command(flatten)]
    global: cmd::common::Global,
    /// Print the cluster's status (as `kelp status`; Ceph's `ceph -s`).
    #[arg(short = 's', long = "status", conflicts_with = "watch")]
    status: bool,
    /// Print the cluster's status, then follow its events (as `kelp watch`; Ceph's `ceph -w`).
    #[arg(short = 'w', long = "watch")]
    watch: bool,
    #[command(subcommand)]
    command: Option<Command>,
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
    /// OSDs: run an OSD daemon (run), manage OSDs (tree, ls, out, in, down) and erasure-code
    /// profiles (erasure-code-profile).
    #[command(subcommand)]
    Osd(cmd::osd::OsdCommand),
    /// Pools (replicated or erasure-coded): create, ls, get, set, rm.
    #[command(subcommand)]
    Pool(cmd::pool::PoolCommand),
    /// Objects: put, get, ls, rm, stat, xattrs, omap, and the `bench` load generator.
    Rados(cmd::rados::RadosArgs),
    /// Block images: create, ls, info, resize, rm, mv, du, snapshots, clones, import/export,
    /// bench (like Ceph's `rbd`). Images are served to block clients by `kelp nbd`.
    Rbd(cmd::rbd::RbdArgs),
    /// Serve block images over NBD (export POOL/IMAGE, or POOL/IMAGE@SNAP read-only) to qemu,
    /// nbdcopy, nbdfuse, fio or the kernel's nbd-client.
    Nbd(cmd::nbd::NbdArgs),
    /// Cluster status: health, monitors, OSDs, pools and PG states.
    Status(cmd::status::StatusArgs),
    /// Space used, per pool and in all (Ceph's `ceph df`): RAW STORAGE (the OSDs' size,
    /// available and used bytes) and, per pool, STORED (logical bytes of its objects),
    /// OBJECTS, USED (raw bytes: STORED × size for replicated pools, × (k+m)/k for
    /// erasure-coded ones), %USED and MAX AVAIL (logical bytes it can take before its fullest
    /// OSD reaches the full ratio). `-f json` prints Ceph's `ceph df -f json` keys.
    Df(cmd::df::DfArgs),
    /// Cluster health (HEALTH_OK / HEALTH_WARN / HEALTH_ERR) and, with `detail`, what is wrong.
    Health(cmd::status::HealthArgs),
    /// Placement groups: `ls` with state, up and acting sets; `scrub`, `deep-scrub`, `repair`,
    /// `list-inconsistent`.
    #[command(subcommand)]
    Pg(cmd::pg::PgCommand),
    /// Central configuration kept by the monitors: set, get, rm, dump; help on every key.
    #[command(subcommand, disable_help_subcommand = true)]
    Config(cmd::config::ConfigCommand),
    /// The S3 gateway daemon: a stateless S3 service on the cluster (run as many as you like).
    Rgw(cmd::rgw::RgwArgs),
    /// S3 administration (users, keys, buckets, garbage collection).
    #[command(subcommand)]
    S3(cmd::rgw::S3Command),
    /// Print the cluster's status, then one line per event as it happens, from the cluster
    /// log the monitors keep: health changes, OSDs going down or up, in or out, pools created
    /// or removed, manager failovers, scrub errors; and PG state changes (Ceph's `ceph -w`).
    /// Ctrl-C stops it.
    Watch(cmd::watch::WatchArgs),
    /// Print a shell completion script for kelp (e.g. `kelp completions bash >
    /// /etc/bash_completion.d/kelp`, or `source <(kelp completions bash)`).
    Completions(cmd::help::CompletionArgs),
    /// Write man pages for kelp and every subcommand (kelp.1, kelp-status.1, …) into a
    /// directory, or print kelp(1) to stdout.
    Man(cmd::help::ManArgs),
    // File-system map and MDS administration.
    /// File systems (Ceph's `ceph fs`): new, ls, status, rm, set, fail, add_data_pool,
    /// rm_data_pool.
    #[command(subcommand)]
    Fs(cmd::fs::FsCommand),
    /// Metadata server daemons as the monitors see them: stat, fail.
    #[command(subcommand)]
    Mds(cmd::mds::MdsCommand),
    // --- metrics ---
    /// Print the metric reference of docs/METRICS.md (every metric's name, type, labels and
    /// meaning), generated from the daemons' metric tables.
    #[command(hide = true)]
    MetricsDoc,
    // Manager, dashboard, progress and cluster log.
    /// The manager daemon (run), its dashboard URL (services) and the manager map (stat).
    #[command(subcommand)]
    Mgr(cmd::mgr::MgrCommand),
    /// Long operations (recovery, backfill, scrub, deep scrub, bucket reshard) with how far
    /// along each is and its estimated time left, as the active manager follows them.
    Progress(cmd::mgr::ProgressArgs),
    /// The cluster log kept by the monitors: `last [N]` (like `ceph log last`), `add TEXT`.
    #[command(subcommand)]
    Log(cmd::mgr::LogCommand),
    /// Web dashboard users: ac-user-create NAME --role admin|read-only, ac-user-ls,
    /// ac-user-rm.
    #[command(subcommand)]
    Dashboard(cmd::mgr::DashboardCommand),
}

fn main() -> ExitCode {
    no_transparent_huge_pages();
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
    let g = cli.global;
    let command = match cli.command {
        Some(_) if cli.status || cli.watch => {
            eprintln!("kelp: error: -s and -w take no subcommand (`kelp -s` is `kelp status`)");
            return ExitCode::from(2);
        }
        Some(c) => c,
        None if cli.status => Command::Status(cmd::status::StatusArgs {}),
        None if cli.watch => Command::Watch(cmd::watch::WatchArgs::default()),
        None => {
            let _ = Cli::command().print_help();
            return ExitCode::from(2);
        }
    };
    let result = match command {
        Command::Up(a) => cmd::up::run_up(a, &g),
        Command::Rgw(a) => cmd::rgw::run_gateway(a, &g),
        Command::S3(c) => cmd::rgw::run_admin(c, &g),
        Command::Down(a) => cmd::up::run_down(a, &g),
        Command::Daemon(c) => cmd::up::run_daemon(c, &g),
        Command::Crush(c) => cmd::crush::run(c, &g),
        Command::Store(c) => cmd::store::run(c, &g),
        Command::Mon(c) => cmd::mon::run(c, &g),
        Command::Osd(c) => cmd::osd::run(c, &g),
        Command::Pool(c) => cmd::pool::run(c, &g),
        Command::Rados(a) => cmd::rados::run(a, &g),
        Command::Rbd(a) => cmd::rbd::run(a, &g),
        Command::Nbd(a) => cmd::nbd::run(a, &g),
        Command::Status(a) => cmd::status::run_status(a, &g),
        Command::Health(a) => cmd::status::run_health(a, &g),
        Command::Df(a) => cmd::df::run(a, &g),
        Command::Pg(c) => cmd::pg::run_pg(c, &g),
        Command::Config(c) => cmd::config::run(c, &g),
        Command::Watch(a) => cmd::watch::run(a, &g),
        Command::Completions(a) => cmd::help::completions(a, Cli::command()),
        Command::Man(a) => cmd::help::man(a, Cli::command()),
        // File-system map and MDS administration.
        Command::Fs(c) => cmd::fs::run(c, &g),
        Command::Mds(c) => cmd::mds::run(c, &g),
        Command::MetricsDoc => cmd::service_map::run_metrics_doc(),
        // Manager, dashboard, progress and cluster log.
        Command::Mgr(c) => cmd::mgr::run_mgr(c, &g),
        Command::Progress(a) => cmd::mgr::run_progress(a, &g),
        Command::Log(c) => cmd::mgr::run_log(c, &g),
        Command::Dashboard(c) => cmd::mgr::run_dashboard(c, &g),
    };
    match result {
        Ok(code) => code,
        Err(err) => {
            let closed_stdout = err.chain().any(|e| {
                e.downcast_ref::<std::io::Error>()
                    .is_some_and(|io| io.kind() == std::io::ErrorKind::BrokenPipe)
            }) && err.to_string().starts_with("writing the");
            if closed_stdout {
                // `kelp man | head`: end as other Unix tools do, by SIGPIPE, silently
                // SAFETY: plain libc calls; the process is meant to end here.
                unsafe {
                    libc::signal(libc::SIGPIPE, libc::SIG_DFL);
                    libc::raise(libc::SIGPIPE);
                }
            }
            eprintln!("kelp: error: {err:#}");
            ExitCode::from(1)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn command_definitions_are_consistent() {
        // clap checks duplicate and conflicting options only in debug builds; the tests run
        // in release, so ask for the checks explicitly (a global option that a subcommand
        // also defines would be caught here).
        Cli::command().debug_assert();
    }

    fn parse(args: &[&str]) -> Cli {
        Cli::try_parse_from(args).unwrap_or_else(|e| panic!("{args:?}: {e}"))
    }

    #[test]
    fn global_options_go_before_or_after_the_subcommand() {
        for args in [
            &[
                "kelp", "-c", "F", "-f", "json", "--name", "client.x", "osd", "tree",
            ][..],
            &[
                "kelp", "osd", "tree", "-c", "F", "--format", "json", "--name", "client.x",
            ],
            &[
                "kelp",
                "osd",
                "-c",
                "F",
                "tree",
                "-f",
                "json",
                "--name=client.x",
            ],
        ] {
            let cli = parse(args);
            assert_eq!(
                cli.global.conf.conf.as_deref(),
                Some(std::path::Path::new("F"))
            );
            assert_eq!(cli.global.format, cmd::OutputFormat::Json, "{args:?}");
            assert_eq!(cli.global.conf.entity, "client.x");
            assert!(matches!(cli.command, Some(Command::Osd(_))));
        }
        let cli = parse(&["kelp", "--cluster", "D", "-k", "K", "status"]);
        assert_eq!(cli.global.conf.path(), std::path::Path::new("D/kelp.conf"));
        assert_eq!(
            cli.global.conf.keyring.as_deref(),
            Some(std::path::Path::new("K"))
        );
        assert_eq!(
            cli.global.conf.cluster_dir(None),
            std::path::Path::new("D"),
            "--cluster is the default of --dir"
        );
        let cli = parse(&["kelp", "-s"]);
        assert!(cli.status && cli.command.is_none());
        let cli = parse(&["kelp", "-w"]);
        assert!(cli.watch && cli.command.is_none());
        assert!(Cli::try_parse_from(["kelp", "-s", "-w"]).is_err());
    }
}
