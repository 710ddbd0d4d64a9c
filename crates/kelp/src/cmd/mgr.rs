//! `kelp mgr` (run the manager, `services`, `stat`), `kelp progress`, `kelp log` and
//! `kelp dashboard` (users of the web dashboard). The daemon is `kelp_mgr`; this module parses
//! arguments and prints what the monitors answer.

use std::net::SocketAddr;
use std::process::ExitCode;

use anyhow::{Context, Result, bail};
use clap::{Args, Subcommand};
use kelp_mgr::auth::{self, Role};
use kelp_proto::{LogEntry, LogLevel, MgrMap, MonCommand, MonReply, ProgressItem};

use crate::cmd::OutputFormat;
use crate::cmd::common::{self, Global};
use crate::cmd::status::{progress_bar, short_duration};

/// The manager: run it, and ask the monitors about it.
#[derive(Subcommand, Debug)]
pub enum MgrCommand {
    /// Run a manager daemon until SIGTERM/SIGINT. Managers beacon to the monitors every
    /// second; the first one becomes active (it polls the cluster, follows long work and
    /// serves the web dashboard), the others stand by and take over when the active one has
    /// been silent for mgr_beacon_grace (5 s). A standby's dashboard address redirects to the
    /// active one. Logs go to stderr (RUST_LOG, default info).
    Run(MgrRunArgs),
    /// The active manager's services as URLs (like `ceph mgr services`): `{"dashboard": URL}`
    /// with --format json.
    Services,
    /// The manager map: the active manager, the standbys, the epoch.
    Stat,
}

#[derive(Args, Debug)]
pub struct MgrRunArgs {
    /// This manager's name (its daemon is mgr.NAME).
    #[arg(long)]
    pub id: String,
    /// Where the dashboard listens (port 0: any free port; `kelp mgr services` tells which).
    #[arg(long, default_value = "127.0.0.1:8443", value_name = "HOST:PORT")]
    pub dashboard_addr: SocketAddr,
    /// Seconds between two looks at the cluster while active.
    #[arg(long, default_value_t = 2.0, value_name = "SECS")]
    pub poll_interval: f64,
    /// This manager's directory (`kelp up` makes DIR/mgr.NAME): the daemon writes its
    /// dashboard's address into DIR/addr once it listens.
    #[arg(long, value_name = "DIR")]
    pub data: Option<std::path::PathBuf>,
    /// If --dashboard-addr's port is taken, listen on any free port instead of failing
    /// (`kelp up` uses this so that clusters started side by side never fail on it).
    #[arg(long)]
    pub any_port_if_taken: bool,
}

/// Long operations the active manager follows (recovery, backfill, scrub, deep scrub,
/// bucket reshard), with how far along each is and its estimated time left.
#[derive(Args, Debug)]
pub struct ProgressArgs {}

/// The cluster log the monitors keep.
#[derive(Subcommand, Debug)]
pub enum LogCommand {
    /// The newest N entries (default 20), oldest first (like `ceph log last`).
    Last {
        /// How many entries.
        #[arg(default_value_t = 20)]
        n: u32,
    },
    /// Add a line to the cluster log (like `ceph log TEXT`).
    Add {
        /// The text.
        #[arg(required = true)]
        text: Vec<String>,
    },
}

/// Users of the web dashboard: each logs in with a name and a key the monitors keep.
#[derive(Subcommand, Debug)]
pub enum DashboardCommand {
    /// Create a user and print its key (or print the key of an existing user with the same
    /// role). Roles: admin (may mark OSDs out/in and start deep scrubs) and read-only.
    #[command(name = "ac-user-create")]
    Create {
        /// The user's name (letters, digits, '-', '_').
        name: String,
        #[arg(long, default_value = "read-only", value_parser = ["admin", "read-only"])]
        role: String,
    },
    /// The dashboard's users and their roles.
    #[command(name = "ac-user-ls")]
    Ls,
    /// Remove a user (its key stops working within 30 s).
    #[command(name = "ac-user-rm")]
    Rm { name: String },
}

pub fn run_mgr(cmd: MgrCommand, g: &Global) -> Result<ExitCode> {
    match cmd {
        MgrCommand::Run(a) => run_daemon(a, g),
        MgrCommand::Services => {
            let map = mgr_map(g)?;
            let url = map.active.as_ref().map(|a| a.dashboard_url.clone());
            if g.format == OutputFormat::Json {
                let v = match &url {
                    Some(u) => serde_json::json!({"dashboard": u}),
                    None => serde_json::json!({}),
                };
                println!("{v}");
            } else {
                match url {
                    Some(u) => println!("dashboard: {u}"),
                    None => println!("no active manager"),
                }
            }
            Ok(ExitCode::SUCCESS)
        }
        MgrCommand::Stat => {
            let map = mgr_map(g)?;
            if g.format == OutputFormat::Json {
                println!("{}", serde_json::to_string_pretty(&mgr_map_json(&map))?);
            } else {
                println!("epoch {}", map.epoch);
                match &map.active {
                    Some(a) => println!("active: mgr.{} ({})", a.name, a.dashboard_url),
                    None => println!("active: none"),
                }
                for s in &map.standbys {
                    println!("standby: mgr.{} ({})", s.name, s.dashboard_url);
                }
            }
            Ok(ExitCode::SUCCESS)
        }
    }
}

pub fn mgr_map_json(map: &MgrMap) -> serde_json::Value {
    serde_json::json!({
        "epoch": map.epoch,
        "active_name": map.active.as_ref().map(|a| a.name.clone()),
        "active": map.active,
        "standbys": map.standbys,
        "available": map.active.is_some(),
    })
}

fn mgr_map(g: &Global) -> Result<MgrMap> {
    let rt = common::runtime()?;
    rt.block_on(async {
        let rados = g.conf.connect().await?;
        match rados.mon_command(MonCommand::MgrStat).await? {
            MonReply::MgrMap(m) => Ok(m),
            other => bail!("unexpected reply {other:?}"),
        }
    })
}

fn run_daemon(a: MgrRunArgs, g: &Global) -> Result<ExitCode> {
    common::init_logging("info");
    if !auth::valid_user_name(&a.id) {
        bail!("--id '{}': letters, digits, '-' and '_' only", a.id);
    }
    let client = g.conf.client_config()?;
    let mut opts = kelp_mgr::MgrOptions::new(&a.id, client, a.dashboard_addr);
    if !(a.poll_interval > 0.0 && a.poll_interval <= 3600.0) {
        bail!("--poll-interval must be between 0 and 3600 seconds");
    }
    opts.poll_interval = std::time::Duration::from_secs_f64(a.poll_interval);
    opts.addr_file = a.data.as_ref().map(|d| d.join("addr"));
    opts.any_port_if_taken = a.any_port_if_taken;
    // two workers are plenty: the manager polls and answers small requests
    let rt = common::runtime_with_threads(Some(2))?;
    rt.block_on(async {
        common::trim_heap_periodically();
        kelp_mgr::run(opts, common::shutdown_signal()).await
    })
    .with_context(|| format!("mgr.{}", a.id))?;
    Ok(ExitCode::SUCCESS)
}

/// The progress items the active manager last published.
pub async fn progress_items(rados: &kelp_client::Rados) -> Vec<ProgressItem> {
    match rados.mon_command(MonCommand::ProgressGet).await {
        Ok(MonReply::Progress(items)) => items,
        _ => Vec::new(),
    }
}

pub fn progress_item_json(p: &ProgressItem) -> serde_json::Value {
    serde_json::json!({
        "id": p.id, "kind": p.kind.name(), "message": p.message, "fraction": p.fraction(),
        "eta_secs": p.eta_secs, "started_ms": p.started_ms, "finished_ms": p.finished_ms,
    })
}

/// Two lines per item, like `ceph -s`'s progress section.
pub fn progress_item_lines(p: &ProgressItem) -> [String; 2] {
    let tail = match (p.finished_ms, p.eta_secs) {
        (Some(_), _) => "(done)".to_string(),
        (None, Some(s)) => format!("(remaining: {})", short_duration(s)),
        (None, None) => "(remaining: unknown)".to_string(),
    };
    [
        p.message.clone(),
        format!("  {} {tail}", progress_bar(p.fraction(), 28)),
    ]
}

pub fn run_progress(_a: ProgressArgs, g: &Global) -> Result<ExitCode> {
    let rt = common::runtime()?;
    let items = rt.block_on(async {
        let rados = g.conf.connect().await?;
        anyhow::Ok(progress_items(&rados).await)
    })?;
    if g.format == OutputFormat::Json {
        let v: Vec<_> = items.iter().map(progress_item_json).collect();
        println!("{}", serde_json::to_string_pretty(&v)?);
        return Ok(ExitCode::SUCCESS);
    }
    if items.is_empty() {
        println!("no long operations (or no active manager)");
    }
    for p in &items {
        let pct = p.fraction() * 100.0;
        let eta = match (p.finished_ms, p.eta_secs) {
            (Some(_), _) => "done".to_string(),
            (None, Some(s)) => format!("ETA {}", short_duration(s)),
            (None, None) => "ETA unknown".to_string(),
        };
        println!(
            "{:<11} {} {pct:5.1}% {eta:<12} {}",
            p.kind.name(),
            progress_bar(p.fraction(), 20),
            p.message
        );
    }
    Ok(ExitCode::SUCCESS)
}

fn stamp(ms: u64) -> String {
    crate::cmd::watch::utc_timestamp(std::time::Duration::from_millis(ms))
}

pub fn log_line(e: &LogEntry) -> String {
    format!(
        "{} {} [{}] {}",
        stamp(e.stamp_ms),
        e.who,
        e.level.short(),
        e.message
    )
}

pub fn log_entry_json(e: &LogEntry) -> serde_json::Value {
    serde_json::json!({"seq": e.seq, "stamp": stamp(e.stamp_ms), "stamp_ms": e.stamp_ms,
        "name": e.who, "priority": format!("[{}]", e.level.short()), "message": e.message})
}

/// The newest `n` cluster-log entries.
pub async fn log_last(rados: &kelp_client::Rados, n: u32) -> Result<Vec<LogEntry>> {
    match rados.mon_command(MonCommand::LogLast { n }).await? {
        MonReply::ClusterLog(e) => Ok(e),
        MonReply::Error { message } => bail!("{message}"),
        other => bail!("unexpected reply {other:?}"),
    }
}

pub fn run_log(cmd: LogCommand, g: &Global) -> Result<ExitCode> {
    let rt = common::runtime()?;
    rt.block_on(async {
        let rados = g.conf.connect().await?;
        match cmd {
            LogCommand::Last { n } => {
                let entries = log_last(&rados, n).await?;
                if g.format == OutputFormat::Json {
                    let v: Vec<_> = entries.iter().map(log_entry_json).collect();
                    println!("{}", serde_json::to_string_pretty(&v)?);
                } else {
                    for e in &entries {
                        println!("{}", log_line(e));
                    }
                }
            }
            LogCommand::Add { text } => {
                let entry = LogEntry {
                    seq: 0,
                    stamp_ms: 0,
                    level: LogLevel::Info,
                    who: g.conf.entity.clone(),
                    message: text.join(" "),
                };
                match rados
                    .mon_command(MonCommand::LogAppend {
                        entries: vec![entry],
                    })
                    .await?
                {
                    MonReply::Done { .. } => {}
                    MonReply::Error { message } => bail!("{message}"),
                    other => bail!("unexpected reply {other:?}"),
                }
            }
        }
        anyhow::Ok(())
    })?;
    Ok(ExitCode::SUCCESS)
}

/// Creates (or finds) dashboard user `name` with `role` and returns its key.
pub async fn dashboard_user_create(
    rados: &kelp_client::Rados,
    name: &str,
    role: Role,
) -> Result<String> {
    if !auth::valid_user_name(name) {
        bail!("user name '{name}': 1-64 letters, digits, '-' or '_'");
    }
    let entities = match rados.mon_command(MonCommand::AuthList).await? {
        MonReply::Entities(e) => e,
        other => bail!("unexpected reply {other:?}"),
    };
    for e in &entities {
        if let Some((r, n)) = auth::parse_entity(e)
            && n == name
            && r != role
        {
            bail!(
                "dashboard user '{name}' exists with role {} (remove it first: kelp dashboard ac-user-rm {name})",
                r.name()
            );
        }
    }
    match rados
        .mon_command(MonCommand::AuthGetOrCreate {
            entity: auth::entity_for(name, role),
        })
        .await?
    {
        MonReply::Key { secret, .. } => Ok(secret),
        MonReply::Error { message } => bail!("{message}"),
        other => bail!("unexpected reply {other:?}"),
    }
}

pub fn run_dashboard(cmd: DashboardCommand, g: &Global) -> Result<ExitCode> {
    let rt = common::runtime()?;
    rt.block_on(async {
        let rados = g.conf.connect().await?;
        match cmd {
            DashboardCommand::Create { name, role } => {
                let role = Role::parse(&role).context("role must be admin or read-only")?;
                let key = dashboard_user_create(&rados, &name, role).await?;
                if g.format == OutputFormat::Json {
                    println!(
                        "{}",
                        serde_json::json!({"user": name, "role": role.name(), "key": key})
                    );
                } else {
                    println!("user {name} ({}) key: {key}", role.name());
                }
            }
            DashboardCommand::Ls => {
                let entities = match rados.mon_command(MonCommand::AuthList).await? {
                    MonReply::Entities(e) => e,
                    other => bail!("unexpected reply {other:?}"),
                };
                let users: Vec<(Role, &str)> = entities
                    .iter()
                    .filter_map(|e| auth::parse_entity(e))
                    .collect();
                if g.format == OutputFormat::Json {
                    let v: Vec<_> = users
                        .iter()
                        .map(|(r, n)| serde_json::json!({"user": n, "role": r.name()}))
                        .collect();
                    println!("{}", serde_json::to_string_pretty(&v)?);
                } else {
                    for (r, n) in users {
                        println!("{n} {}", r.name());
                    }
                }
            }
            DashboardCommand::Rm { name } => {
                let mut removed = false;
                for role in [Role::Admin, Role::ReadOnly] {
                    if let MonReply::Done { .. } = rados
                        .mon_command(MonCommand::AuthRm {
                            entity: auth::entity_for(&name, role),
                        })
                        .await?
                    {
                        removed = true;
                    }
                }
                if !removed {
                    bail!("no dashboard user '{name}'");
                }
            }
        }
        anyhow::Ok(())
    })?;
    Ok(ExitCode::SUCCESS)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stamps_are_utc_iso() {
        assert_eq!(stamp(0), "1970-01-01T00:00:00.000Z");
        assert_eq!(stamp(1_700_000_000_123), "2023-11-14T22:13:20.123Z");
    }
}
