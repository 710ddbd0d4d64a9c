//! The cluster configuration file (`kelp.conf`, TOML) that every daemon and client reads at
//! start.
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
//! Unknown keys are refused (a typo must not pass silently). Settings that can change while
//! the cluster runs belong in the monitors' central configuration ([`crate::keys`]) instead.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

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

/// Why `kelp.conf` could not be loaded (the messages name the file).
#[derive(Debug, thiserror::Error)]
pub enum ConfFileError {
    #[error("cannot read {path}: {source}")]
    Read {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("{path}: {message}")]
    Parse { path: PathBuf, message: String },
    #[error("{path}: mon_host lists no monitors")]
    NoMonitors { path: PathBuf },
}

/// The parsed `kelp.conf`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ClusterConf {
    pub global: GlobalSection,
    #[serde(default, skip_serializing_if = "OsdSection::is_empty")]
    pub osd: OsdSection,
}

impl ClusterConf {
    /// Reads and checks `path`; a relative keyring path is made relative to its folder.
    pub fn load(path: &Path) -> Result<ClusterConf, ConfFileError> {
        let text = std::fs::read_to_string(path).map_err(|source| ConfFileError::Read {
            path: path.to_path_buf(),
            source,
        })?;
        let mut conf = ClusterConf::parse(&text).map_err(|e| ConfFileError::Parse {
            path: path.to_path_buf(),
            message: e.to_string(),
        })?;
        if conf.global.mon_host.is_empty() {
            return Err(ConfFileError::NoMonitors {
                path: path.to_path_buf(),
            });
        }
        if conf.global.keyring.is_relative() {
            let dir = path.parent().unwrap_or(Path::new("."));
            conf.global.keyring = dir.join(&conf.global.keyring);
        }
        Ok(conf)
    }

    /// Parses the file's text (no checks beyond the schema).
    pub fn parse(text: &str) -> Result<ClusterConf, toml::de::Error> {
        toml::from_str(text)
    }

    /// The file's text.
    pub fn to_toml(&self) -> String {
        // a struct of strings, addresses, paths and integers always serialises
        toml::to_string(self).unwrap_or_default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const GLOBAL: &str =
        "[global]\nfsid = \"f\"\nmon_host = [\"127.0.0.1:6789\"]\nkeyring = \"keyring\"\n";

    #[test]
    fn osd_section_is_optional_and_round_trips() {
        let plain = ClusterConf::parse(GLOBAL).unwrap();
        assert_eq!(plain.osd, OsdSection::default());
        // Written back without an empty `[osd]` table.
        assert!(!plain.to_toml().contains("[osd]"));

        let text = format!("{GLOBAL}[osd]\ncache = \"128MiB\"\nthreads = 1\n");
        let conf = ClusterConf::parse(&text).unwrap();
        assert_eq!(conf.osd.cache.as_deref(), Some("128MiB"));
        assert_eq!(conf.osd.threads, Some(1));
        assert_eq!(ClusterConf::parse(&conf.to_toml()).unwrap(), conf);
    }

    #[test]
    fn unknown_osd_keys_are_refused() {
        let text = format!("{GLOBAL}[osd]\ncahce = \"128MiB\"\n");
        let e = ClusterConf::parse(&text).unwrap_err().to_string();
        assert!(e.contains("cahce"), "{e}");
    }

    #[test]
    fn load_resolves_the_keyring_and_needs_monitors() {
        let dir = std::env::temp_dir().join(format!("kelp-conf-test-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("kelp.conf");
        std::fs::write(&path, GLOBAL).unwrap();
        let conf = ClusterConf::load(&path).unwrap();
        assert_eq!(conf.global.keyring, dir.join("keyring"));
        std::fs::write(&path, GLOBAL.replace("\"127.0.0.1:6789\"", "")).unwrap();
        let e = ClusterConf::load(&path).unwrap_err().to_string();
        assert!(e.ends_with("mon_host lists no monitors"), "{e}");
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
