//! `kelp config`: the monitors' central configuration (`kelp config set osd osd_max_backfills 2`).

use std::process::ExitCode;

use anyhow::{Result, bail};
use clap::{Args, Subcommand};
use kelp_proto::{ConfigEntry, MonCommand, MonReply};

use crate::cmd::OutputFormat;
use crate::cmd::common::{self, ConfArgs};

#[derive(Subcommand, Debug)]
pub enum ConfigCommand {
    /// Set KEY for WHO (`global`, a daemon type such as `osd`, or one daemon such as `osd.3`).
    /// Unknown keys are refused; `kelp config dump` lists what is set.
    Set(SetArgs),
    /// The value of KEY that applies to WHO (`osd.3` falls back to `osd`, then `global`),
    /// among the values set centrally.
    Get(GetArgs),
    /// Remove KEY for WHO.
    Rm(GetArgs),
    /// Every centrally set value.
    Dump(DumpArgs),
}

#[derive(Args, Debug)]
pub struct SetArgs {
    /// Who the option applies to: `global`, a daemon type (`osd`, `mon`) or one daemon
    /// (`osd.2`).
    pub who: String,
    /// The option's name.
    pub key: String,
    /// The new value.
    pub value: String,
}

#[derive(Args, Debug)]
pub struct GetArgs {
    /// Whose value: `global`, a daemon type (`osd`, `mon`) or one daemon (`osd.2`).
    pub who: String,
    /// The option's name.
    pub key: String,
}

#[derive(Args, Debug)]
pub struct DumpArgs {}

async fn dump(conf: &ConfArgs) -> Result<Vec<ConfigEntry>> {
    let rados = conf.connect().await?;
    match rados.mon_command(MonCommand::ConfigDump).await? {
        MonReply::Config(entries) => Ok(entries),
        other => bail!("unexpected reply {other:?}"),
    }
}

pub fn run(cmd: ConfigCommand, g: &crate::cmd::common::Global) -> Result<ExitCode> {
    let rt = common::runtime()?;
    rt.block_on(async move {
        match cmd {
            ConfigCommand::Set(a) => {
                let rados = g.conf.connect().await?;
                rados
                    .mon_command(MonCommand::ConfigSet {
                        who: a.who,
                        key: a.key,
                        value: a.value,
                    })
                    .await?;
            }
            ConfigCommand::Rm(a) => {
                let rados = g.conf.connect().await?;
                rados
                    .mon_command(MonCommand::ConfigRm { who: a.who, key: a.key })
                    .await?;
            }
            ConfigCommand::Get(a) => {
                let entries = dump(&g.conf).await?;
                // Most specific first: osd.3, then osd, then global.
                let mut chain = vec![a.who.clone()];
                if let Some((kind, _)) = a.who.split_once('.') {
                    chain.push(kind.to_string());
                }
                chain.push("global".to_string());
                let found = chain.iter().find_map(|who| {
                    entries
                        .iter()
                        .find(|e| &e.who == who && e.key == a.key)
                        .map(|e| e.value.clone())
                });
                match found {
                    Some(v) => println!("{v}"),
                    None => bail!(
                        "{} is not set for {} (the daemon's built-in default applies)",
                        a.key,
                        a.who
                    ),
                }
            }
            ConfigCommand::Dump(_) => {
                let entries = dump(&g.conf).await?;
                match g.format {
                    OutputFormat::Json => {
                        let v: Vec<_> = entries
                            .iter()
                            .map(|e| serde_json::json!({"section": e.who, "name": e.key, "value": e.value}))
                            .collect();
                        println!("{}", serde_json::to_string_pretty(&v)?);
                    }
                    OutputFormat::Plain => {
                        println!("{:<12} {:<32} VALUE", "WHO", "OPTION");
                        for e in entries {
                            println!("{:<12} {:<32} {}", e.who, e.key, e.value);
                        }
                    }
                }
            }
        }
        Ok(ExitCode::SUCCESS)
    })
}
