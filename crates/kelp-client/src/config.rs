//! The cluster configuration file (`kelp.conf`, TOML) and client settings.
//!
//! ```toml
//! [global]
//! fsid = "6f0c…"
//! mon_host = ["127.0.0.1:6789"]
//! keyring = "keyring"          # relative to this file's folder
//!
//! [osd]                        # optional: defaults for `kelp osd run` on this machine
//! cache = "128MiB"             # the store's memory budget (`--cache` overrides it)
//! threads = 1                  # async worker threads per OSD (`--threads` overrides it)
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

/// Defaults for the OSD daemons that read this file (`kelp osd run`); a command-line option
/// overrides each. Absent keys keep the daemon's own defaults.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct OsdSection {
    /// The store's memory budget, e.g. `"128MiB"` (`kelp osd run --cache`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cache: Option<String>,
    /// Async worker threads per OSD process (`kelp osd run --threads`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub threads: Option<usize>,
}

impl OsdSection {
    fn is_empty(&self) -> bool {
        self.cache.is_none() && self.threads.is_none()
    }
}

/// The parsed `kelp.conf`. Unknown keys are refused so typos do not pass silently.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ClusterConf {
    pub global: GlobalSection,
    #[serde(default, skip_serializing_if = "OsdSection::is_empty")]
    pub osd: OsdSection,
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
        Self::from_conf_file_with_keyring(path, entity, None)
    }

    /// As [`ClientConfig::from_conf_file`], with the key taken from `keyring` instead of the
    /// keyring the configuration names, when given (`kelp --keyring`).
    pub fn from_conf_file_with_keyring(
        path: &Path,
        entity: &str,
        keyring: Option<&Path>,
    ) -> Result<ClientConfig, ClientError> {
        let conf = ClusterConf::load(path)?;
        let keyring_path = keyring.unwrap_or(&conf.global.keyring);
        let keyring = Keyring::load(keyring_path)
            .map_err(|e| ClientError::Config(format!("keyring {}: {e}", keyring_path.display())))?;
        let secret = keyring.secret_for(entity).ok_or_else(|| {
            ClientError::Config(format!(
                "keyring {} has no key for {entity}",
                keyring_path.display()
            ))
        })?;
        Ok(ClientConfig::new(conf.global.mon_host, entity, secret))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(text: &str) -> Result<ClusterConf, toml::de::Error> {
        toml::from_str(text)
    }

    const GLOBAL: &str =
        "[global]\nfsid = \"f\"\nmon_host = [\"127.0.0.1:6789\"]\nkeyring = \"keyring\"\n";

    #[test]
    fn osd_section_is_optional_and_round_trips() {
        let plain = parse(GLOBAL).unwrap();
        assert_eq!(plain.osd, OsdSection::default());
        // Written back without an empty `[osd]` table.
        assert!(!toml::to_string(&plain).unwrap().contains("[osd]"));

        let text = format!("{GLOBAL}[osd]\ncache = \"128MiB\"\nthreads = 1\n");
        let conf = parse(&text).unwrap();
        assert_eq!(conf.osd.cache.as_deref(), Some("128MiB"));
        assert_eq!(conf.osd.threads, Some(1));
        assert_eq!(parse(&toml::to_string(&conf).unwrap()).unwrap(), conf);
    }

    #[test]
    fn unknown_osd_keys_are_refused() {
        let text = format!("{GLOBAL}[osd]\ncahce = \"128MiB\"\n");
        let e = parse(&text).unwrap_err().to_string();
        assert!(e.contains("cahce"), "{e}");
    }
}
