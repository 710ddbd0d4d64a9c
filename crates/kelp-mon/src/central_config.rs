//! Central configuration: the `(who, key) -> value` table the monitors replicate.
//!
//! The keys it accepts, with their types, defaults and ranges, are the registry in
//! `kelp_config::keys` (also what `kelp config help` prints and docs/CONFIG.md lists): a typo
//! in `kelp config set osd osd_max_backfils 2`, or a value out of range, is refused at once.
//! A value is stored in its normalised printed form, so that every monitor stores
//! byte-identical values (the table is part of the replicated state).
//!
//! Resolution (`effective`): the most specific `who` wins: `osd.3`, then `osd`, then `global`,
//! then the key's default.

use std::collections::BTreeMap;

use kelp_config::ConfigValueError;
pub use kelp_config::{KEYS, KeyDef, ValueKind, key_def};

use crate::error::MonError;

const DAEMON_TYPES: &[&str] = &["mon", "osd", "client", "mgr", "mds"];

/// Checks a `who`: `global`, a daemon type, or `type.id`.
pub fn validate_who(who: &str) -> Result<(), MonError> {
    if who == "global" || DAEMON_TYPES.contains(&who) {
        return Ok(());
    }
    match who.split_once('.') {
        Some((ty, id))
            if DAEMON_TYPES.contains(&ty)
                && !id.is_empty()
                && id.bytes().all(|b| b.is_ascii_graphic()) =>
        {
            Ok(())
        }
        _ => Err(MonError::InvalidWho {
            who: who.to_string(),
        }),
    }
}

/// Validates `value` for `key` (type and range) and returns its normalised form.
pub fn normalize(key: &str, value: &str) -> Result<String, MonError> {
    kelp_config::normalize(key, value).map_err(|e| match e {
        ConfigValueError::UnknownKey { key } => MonError::UnknownConfigKey { key },
        ConfigValueError::Invalid { key, value, reason } => {
            MonError::InvalidConfigValue { key, value, reason }
        }
    })
}

/// The value of `key` for daemon `who` (`osd.3`), resolved through `osd` and `global` to the
/// default. `None` for an unknown key.
pub fn effective(
    table: &BTreeMap<(String, String), String>,
    who: &str,
    key: &str,
) -> Option<String> {
    let def = key_def(key)?;
    let mut candidates = vec![who.to_string()];
    if let Some((ty, _)) = who.split_once('.') {
        candidates.push(ty.to_string());
    }
    candidates.push("global".to_string());
    for w in candidates {
        if let Some(v) = table.get(&(w, key.to_string())) {
            return Some(v.clone());
        }
    }
    Some(def.default.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_are_valid() {
        for def in KEYS {
            let d = def.default.to_string();
            assert_eq!(normalize(def.name, &d).ok(), Some(d), "{}", def.name);
        }
    }

    #[test]
    fn validation_and_resolution() {
        assert!(matches!(
            normalize("osd_max_backfils", "2"),
            Err(MonError::UnknownConfigKey { .. })
        ));
        assert!(normalize("osd_max_backfills", "-1").is_err());
        assert!(normalize("mon_osd_full_ratio", "1.5").is_err());
        assert_eq!(normalize("osd_fast_read", "yes").unwrap(), "true");
        assert!(validate_who("osd.3").is_ok());
        assert!(validate_who("global").is_ok());
        assert!(validate_who("gloabl").is_err());
        assert!(validate_who("osd.").is_err());

        let mut t = BTreeMap::new();
        t.insert(("global".into(), "osd_max_backfills".into()), "2".into());
        t.insert(("osd".into(), "osd_max_backfills".into()), "3".into());
        t.insert(("osd.1".into(), "osd_max_backfills".into()), "4".into());
        assert_eq!(effective(&t, "osd.1", "osd_max_backfills").unwrap(), "4");
        assert_eq!(effective(&t, "osd.2", "osd_max_backfills").unwrap(), "3");
        assert_eq!(effective(&t, "client.x", "osd_max_backfills").unwrap(), "2");
        assert_eq!(effective(&t, "mon", "osd_recovery_sleep").unwrap(), "0");
        assert_eq!(effective(&t, "mon", "nope"), None);
    }
}
