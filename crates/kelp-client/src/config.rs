//! Client settings, from the cluster configuration file (`kelp.conf`, whose schema
//! [`ClusterConf`] lives in `kelp-config`, shared with the daemons) and the keyring it names.
//!
//! The keyring holds one `entity base64-secret` line per entity (kelp-msgr's format).

use std::net::SocketAddr;
use std::path::Path;
use std::time::Duration;

use kelp_config::ClusterConf;
use kelp_msgr::{KeyLookup, Keyring, Secret};

use crate::error::ClientError;

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
        let conf = ClusterConf::load(path).map_err(|e| ClientError::Config(e.to_string()))?;
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
