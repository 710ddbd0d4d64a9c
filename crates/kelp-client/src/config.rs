//! The cluster configuration file (`kelp.conf`, TOML) and client settings.
//!
//! ```toml
//! [global]
//! fsid = "6f0c…"
//! mon_host = ["127.0.0.1:6789"]
//! keyring = "keyring"          # relative to this file's folder
//! ```
//!
//! The keyring holds one `entity base64-secret` line per entity (kelp-msgr's format).

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use kelp_msgr::{KeyLookup, Keyring, Secret};
use serde::{Deserialize, Serialize};

use crate::error::ClientError;

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct GlobalSection {
    pub fsid: String,
    pub mon_host: Vec<SocketAddr>,
    pub keyring: PathBuf,
}

/// The parsed `kelp.conf`. Unknown keys are refused so typos do not pass silently.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ClusterConf {
    pub global: GlobalSection,
}

impl ClusterConf {
    pub fn load(path: &Path) -> Result<ClusterConf, ClientError> {
        let text = std::fs::read_to_string(path)
            .map_err(|e| ClientError::Config(format!("cannot read {}: {e}", path.display())))?;
        let mut conf: ClusterConf = toml::from_str(&text)
            .map_err(|e| ClientError::Config(format!("{}: {e}", path.display())))?;
        if conf.global.mon_host.is_empty() {
            return Err(ClientError::Config(format!(
                "{}: mon_host lists no monitors",
                path.display()
            )));
        }
        if conf.global.keyring.is_relative() {
            let dir = path.parent().unwrap_or(Path::new("."));
            conf.global.keyring = dir.join(&conf.global.keyring);
        }
        Ok(conf)
    }
}

/// Everything a client needs to connect.
#[derive(Clone)]
pub struct ClientConfig {
    pub mons: Vec<SocketAddr>,
    /// The entity to authenticate as, e.g. `client.admin`.
    pub entity: String,
    pub secret: Secret,
    /// Overall deadline of one object operation, retries included.
    pub op_timeout: Duration,
    /// Overall deadline of one monitor command.
    pub mon_timeout: Duration,
}

impl std::fmt::Debug for ClientConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ClientConfig")
            .field("mons", &self.mons)
            .field("entity", &self.entity)
            .field("op_timeout", &self.op_timeout)
            .finish_non_exhaustive()
    }
}

impl ClientConfig {
    pub fn new(mons: Vec<SocketAddr>, entity: &str, secret: Secret) -> ClientConfig {
        ClientConfig {
            mons,
            entity: entity.to_string(),
            secret,
            op_timeout: Duration::from_secs(30),
            mon_timeout: Duration::from_secs(30),
        }
    }

    /// Reads `kelp.conf` and the keyring it names, for `entity`.
    pub fn from_conf_file(path: &Path, entity: &str) -> Result<ClientConfig, ClientError> {
        let conf = ClusterConf::load(path)?;
        let keyring = Keyring::load(&conf.global.keyring).map_err(|e| {
            ClientError::Config(format!("keyring {}: {e}", conf.global.keyring.display()))
        })?;
        let secret = keyring.secret_for(entity).ok_or_else(|| {
            ClientError::Config(format!(
                "keyring {} has no key for {entity}",
                conf.global.keyring.display()
            ))
        })?;
        Ok(ClientConfig::new(conf.global.mon_host, entity, secret))
    }
}
