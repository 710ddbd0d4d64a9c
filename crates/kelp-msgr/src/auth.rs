//! Entities, shared secrets and keyrings.
//!
//! Every connection end is an *entity* (`client.admin`, `osd.3`, `mon.a`) holding a shared
//! secret that the accepting side can look up ([`KeyLookup`]). The secret proves identity in the
//! handshake ([`crate::handshake`]) and never crosses the wire. The monitors will serve keys from
//! their replicated keyring; for now a [`Keyring`] file is the source.
//!
//! Keyring file format: one `entity base64secret` per line, `#` starts a comment, blank lines
//! are ignored. Files are written with mode 0600 because they hold secrets.

use std::collections::BTreeMap;
use std::fmt;
use std::io::Write;
use std::path::Path;
use std::sync::Arc;

use base64::Engine;
use base64::engine::general_purpose::STANDARD as BASE64;

use crate::error::{MsgrError, Result};

/// Length of secrets made by [`generate_secret`].
pub const SECRET_LEN: usize = 32;
/// Longest accepted entity name.
pub const MAX_ENTITY_LEN: usize = 128;

/// A shared secret. Cheap to clone; `Debug` never prints the bytes.
#[derive(Clone, PartialEq, Eq)]
pub struct Secret(Arc<[u8]>);

impl Secret {
    /// Wraps raw secret bytes (must be non-empty to be useful; the handshake refuses empty keys
    /// only by failing to match).
    pub fn new(bytes: impl Into<Vec<u8>>) -> Self {
        Secret(Arc::from(bytes.into()))
    }

    /// The raw bytes (for the HMAC).
    pub fn as_bytes(&self) -> &[u8] {
        &self.0
    }

    /// The base64 form used in keyring files.
    pub fn to_base64(&self) -> String {
        BASE64.encode(&self.0)
    }

    /// Parses the base64 form used in keyring files.
    pub fn from_base64(s: &str) -> std::result::Result<Self, base64::DecodeError> {
        BASE64.decode(s.trim()).map(Secret::new)
    }
}

impl fmt::Debug for Secret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Secret(<{} bytes redacted>)", self.0.len())
    }
}

/// A fresh random 32-byte secret from the operating system's CSPRNG.
///
/// ```
/// let s = kelp_msgr::generate_secret();
/// assert_eq!(s.as_bytes().len(), 32);
/// ```
pub fn generate_secret() -> Secret {
    Secret::new(random_bytes::<SECRET_LEN>().to_vec())
}

/// Random bytes from the OS. The OS RNG failing is not a condition the process can continue
/// under safely (nonces would repeat), so it aborts with a clear message.
pub(crate) fn random_bytes<const N: usize>() -> [u8; N] {
    let mut b = [0u8; N];
    if let Err(e) = getrandom::fill(&mut b) {
        panic!("operating system random number generator failed: {e}");
    }
    b
}

/// Where the accepting side finds the secret of the entity that connects to it.
///
/// Implemented by [`Keyring`]; the monitors will implement it over their replicated key table.
pub trait KeyLookup: Send + Sync + 'static {
    /// The secret of `entity`, or `None` if the entity is unknown.
    fn secret_for(&self, entity: &str) -> Option<Secret>;
}

/// Checks that `name` is a plausible entity name: `type.id`, printable ASCII, no whitespace.
pub fn validate_entity(name: &str) -> Result<()> {
    let bad = |reason| {
        Err(MsgrError::InvalidEntity {
            name: name.chars().take(MAX_ENTITY_LEN).collect(),
            reason,
        })
    };
    if name.is_empty() || name.len() > MAX_ENTITY_LEN {
        return bad("must be 1 to 128 bytes");
    }
    if !name.bytes().all(|b| b.is_ascii_graphic()) {
        return bad("must be printable ASCII without spaces");
    }
    match name.split_once('.') {
        Some((ty, id)) if !ty.is_empty() && !id.is_empty() => Ok(()),
        _ => bad("must look like type.id (e.g. osd.3, client.admin)"),
    }
}

/// Entity → secret table, loadable from and savable to a keyring file.
///
/// ```
/// use kelp_msgr::{Keyring, KeyLookup, generate_secret};
/// let mut kr = Keyring::new();
/// kr.insert("client.admin", generate_secret()).unwrap();
/// let text = kr.to_text();
/// let back = Keyring::parse(&text).unwrap();
/// assert_eq!(back.secret_for("client.admin"), kr.secret_for("client.admin"));
/// ```
#[derive(Clone, Debug, Default)]
pub struct Keyring {
    keys: BTreeMap<String, Secret>,
}

impl Keyring {
    /// An empty keyring.
    pub fn new() -> Self {
        Self::default()
    }

    /// Adds or replaces the secret for `entity`.
    pub fn insert(&mut self, entity: &str, secret: Secret) -> Result<()> {
        validate_entity(entity)?;
        self.keys.insert(entity.to_string(), secret);
        Ok(())
    }

    /// Removes `entity`; returns whether it was present.
    pub fn remove(&mut self, entity: &str) -> bool {
        self.keys.remove(entity).is_some()
    }

    /// Entities in the keyring, sorted.
    pub fn entities(&self) -> impl Iterator<Item = &str> {
        self.keys.keys().map(String::as_str)
    }

    /// Parses keyring text. Errors name the line.
    pub fn parse(text: &str) -> Result<Self> {
        Self::parse_named(text, Path::new("<text>"))
    }

    fn parse_named(text: &str, path: &Path) -> Result<Self> {
        let err = |line: usize, reason: String| MsgrError::Keyring {
            path: path.to_path_buf(),
            reason: format!("line {line}: {reason}"),
        };
        let mut kr = Keyring::new();
        for (i, raw) in text.lines().enumerate() {
            let line = raw.split('#').next().unwrap_or("").trim();
            if line.is_empty() {
                continue;
            }
            let mut parts = line.split_whitespace();
            let (Some(entity), Some(b64), None) = (parts.next(), parts.next(), parts.next()) else {
                return Err(err(i + 1, "expected `entity base64secret`".into()));
            };
            validate_entity(entity).map_err(|e| err(i + 1, e.to_string()))?;
            let secret =
                Secret::from_base64(b64).map_err(|e| err(i + 1, format!("bad base64: {e}")))?;
            if secret.as_bytes().is_empty() {
                return Err(err(i + 1, "empty secret".into()));
            }
            if kr.keys.insert(entity.to_string(), secret).is_some() {
                return Err(err(i + 1, format!("duplicate entity {entity}")));
            }
        }
        Ok(kr)
    }

    /// Loads a keyring file.
    pub fn load(path: impl AsRef<Path>) -> Result<Self> {
        let path = path.as_ref();
        let text = std::fs::read_to_string(path).map_err(|e| MsgrError::Keyring {
            path: path.to_path_buf(),
            reason: e.to_string(),
        })?;
        Self::parse_named(&text, path)
    }

    /// The file form: a header comment, then `entity base64secret` lines, sorted.
    pub fn to_text(&self) -> String {
        let mut s = String::from("# kelp keyring: entity base64secret\n");
        for (entity, secret) in &self.keys {
            s.push_str(entity);
            s.push(' ');
            s.push_str(&secret.to_base64());
            s.push('\n');
        }
        s
    }

    /// Writes the keyring to `path` with mode 0600 (created that way, and tightened if the file
    /// already existed), via a temporary file and rename so a crash never leaves half a keyring.
    pub fn save(&self, path: impl AsRef<Path>) -> Result<()> {
        let path = path.as_ref();
        let err = |e: std::io::Error| MsgrError::Keyring {
            path: path.to_path_buf(),
            reason: e.to_string(),
        };
        let mut tmp = path.as_os_str().to_owned();
        tmp.push(".tmp");
        let tmp = std::path::PathBuf::from(tmp);
        let mut opts = std::fs::OpenOptions::new();
        opts.write(true).create(true).truncate(true);
        #[cfg(unix)]
        {
            use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
            opts.mode(0o600);
            let mut f = opts.open(&tmp).map_err(err)?;
            f.set_permissions(std::fs::Permissions::from_mode(0o600))
                .map_err(err)?;
            f.write_all(self.to_text().as_bytes()).map_err(err)?;
            f.sync_all().map_err(err)?;
        }
        #[cfg(not(unix))]
        {
            let mut f = opts.open(&tmp).map_err(err)?;
            f.write_all(self.to_text().as_bytes()).map_err(err)?;
            f.sync_all().map_err(err)?;
        }
        std::fs::rename(&tmp, path).map_err(err)
    }
}

impl KeyLookup for Keyring {
    fn secret_for(&self, entity: &str) -> Option<Secret> {
        self.keys.get(entity).cloned()
    }
}

/// A keyring file that is read again (at most once a second) when an entity it does not know
/// connects, so that an entity added to the file later (a new OSD, a new client key) is
/// accepted without restarting the daemon; a key removed from the file stays known to a
/// running daemon until it restarts.
pub struct ReloadingKeyring {
    path: std::path::PathBuf,
    state: std::sync::Mutex<(Keyring, std::time::Instant)>,
}

/// Shortest time between two reloads of a [`ReloadingKeyring`].
const RELOAD_EVERY: std::time::Duration = std::time::Duration::from_secs(1);

impl ReloadingKeyring {
    /// Watches `path`, starting from `loaded` (its current contents).
    pub fn new(path: impl Into<std::path::PathBuf>, loaded: Keyring) -> Self {
        ReloadingKeyring {
            path: path.into(),
            state: std::sync::Mutex::new((loaded, std::time::Instant::now())),
        }
    }
}

impl KeyLookup for ReloadingKeyring {
    fn secret_for(&self, entity: &str) -> Option<Secret> {
        let mut st = self.state.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(s) = st.0.secret_for(entity) {
            return Some(s);
        }
        if st.1.elapsed() < RELOAD_EVERY {
            return None;
        }
        st.1 = std::time::Instant::now();
        // an unreadable or half-written file keeps the keys already known
        if let Ok(fresh) = Keyring::load(&self.path) {
            for (e, s) in fresh.keys {
                st.0.keys.entry(e).or_insert(s);
            }
        }
        st.0.secret_for(entity)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reloading_keyring_learns_new_entities() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("keyring");
        let mut kr = Keyring::new();
        kr.insert("osd.0", generate_secret()).unwrap();
        kr.save(&path).unwrap();
        let lookup = ReloadingKeyring::new(&path, Keyring::load(&path).unwrap());
        assert!(lookup.secret_for("osd.0").is_some());
        let new = generate_secret();
        kr.insert("osd.7", new.clone()).unwrap();
        kr.save(&path).unwrap();
        // right after a load, a miss does not re-read the file (at most once a second)
        {
            let mut st = lookup.state.lock().unwrap();
            st.1 = std::time::Instant::now() - RELOAD_EVERY;
        }
        assert_eq!(lookup.secret_for("osd.7"), Some(new));
        assert!(lookup.secret_for("osd.8").is_none());
        // garbage in the file keeps what is known
        std::fs::write(&path, "not a keyring line\n").unwrap();
        lookup.state.lock().unwrap().1 = std::time::Instant::now() - RELOAD_EVERY;
        assert!(lookup.secret_for("osd.9").is_none());
        assert!(lookup.secret_for("osd.7").is_some());
    }

    #[test]
    fn parse_comments_and_errors() {
        let s = generate_secret();
        let text = format!(
            "# header\n\nosd.3 {}   # trailing\n  client.admin {}\n",
            s.to_base64(),
            s.to_base64()
        );
        let kr = Keyring::parse(&text).unwrap();
        assert_eq!(kr.entities().collect::<Vec<_>>(), ["client.admin", "osd.3"]);
        assert_eq!(kr.secret_for("osd.3"), Some(s));
        assert!(kr.secret_for("osd.4").is_none());

        for bad in [
            "osd.3",
            "osd.3 !!!notbase64",
            "osd3 AAAA",
            "osd.3 AAAA extra",
            "osd.3 AAAA\nosd.3 AAAA",
        ] {
            let e = Keyring::parse(bad).unwrap_err();
            assert!(e.to_string().contains("line"), "{bad}: {e}");
        }
    }

    #[test]
    fn secrets_are_random_and_redacted() {
        let a = generate_secret();
        let b = generate_secret();
        assert_ne!(a, b);
        assert!(!format!("{a:?}").contains(&a.to_base64()));
    }

    #[test]
    fn entity_names() {
        for ok in ["osd.3", "client.admin", "mon.a", "client.rgw.gw1"] {
            validate_entity(ok).unwrap();
        }
        for bad in ["", "osd", ".3", "osd.", "osd 3", "osd.\u{e9}"] {
            assert!(validate_entity(bad).is_err(), "{bad:?}");
        }
    }

    #[cfg(unix)]
    #[test]
    fn save_is_0600_and_round_trips() {
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("keyring");
        std::fs::write(&path, "old").unwrap();
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o644)).unwrap();
        let mut kr = Keyring::new();
        kr.insert("mon.a", generate_secret()).unwrap();
        kr.save(&path).unwrap();
        let mode = std::fs::metadata(&path).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode, 0o600);
        let back = Keyring::load(&path).unwrap();
        assert_eq!(back.secret_for("mon.a"), kr.secret_for("mon.a"));
    }
}
