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
    /// What KEY does: its type, default, accepted range and who reads it; without KEY, every
    /// key the monitors accept (no cluster needed).
    Help(HelpArgs),
}

#[derive(Args, Debug)]
pub struct HelpArgs {
    /// The option's name; all of them when omitted.
    pub key: Option<String>,
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

/// `kelp config help [KEY]`: the registry, no cluster needed.
fn help(a: &HelpArgs, format: OutputFormat) -> Result<ExitCode> {
    let defs: Vec<&kelp_config::KeyDef> = match &a.key {
        Some(k) => match kelp_config::key_def(k) {
            Some(d) => vec![d],
            None => bail!("unknown config key '{k}' (`kelp config help` lists them)"),
        },
        None => kelp_config::KEYS.to_vec(),
    };
    match format {
        OutputFormat::Json => {
            let v: Vec<_> = defs
                .iter()
                .map(|d| {
                    serde_json::json!({"name": d.name, "type": d.kind().name(),
                        "default": d.default.to_string(), "range": d.range(),
                        "read_by": d.readers, "description": d.doc})
                })
                .collect();
            if a.key.is_some() {
                println!("{}", serde_json::to_string_pretty(&v[0])?);
            } else {
                println!("{}", serde_json::to_string_pretty(&v)?);
            }
        }
        OutputFormat::Plain if a.key.is_some() => {
            print!("{}", kelp_config::keys::help_text(defs[0]))
        }
        OutputFormat::Plain => {
            println!(
                "{:<28} {:<8} {:<8} DESCRIPTION",
                "OPTION", "TYPE", "DEFAULT"
            );
            for d in defs {
                println!(
                    "{:<28} {:<8} {:<8} {}",
                    d.name,
                    d.kind().name(),
                    d.default.to_string(),
                    d.doc
                );
            }
        }
    }
    Ok(ExitCode::SUCCESS)
}

pub fn run(cmd: ConfigCommand, g: &crate::cmd::common::Global) -> Result<ExitCode> {
    if let ConfigCommand::Help(a) = &cmd {
        return help(a, g.format);
    }
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
            ConfigCommand::Help(_) => unreachable!("answered without a cluster above"),
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
