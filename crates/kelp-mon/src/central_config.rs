//! Central configuration: the `(who, key) -> value` table the monitors replicate, and the list
//! of keys it accepts.
//!
//! Why a fixed list: a typo in `kelp config set osd osd_max_backfils 2` must be refused at once
//! with a clear error, not stored and silently ignored. Every key has a type and a default; a
//! value is validated against the type and stored in its normalised printed form, so that every
//! monitor stores byte-identical values (the table is part of the replicated state).
//!
//! Resolution (`effective`): the most specific `who` wins: `osd.3`, then `osd`, then `global`,
//! then the key's default.

use std::collections::BTreeMap;

use crate::error::MonError;

/// The type of a config value.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ValueKind {
    /// A non-negative integer.
    U64,
    /// A non-negative number of seconds (fractions allowed).
    Secs,
    /// A ratio in `0..=1`.
    Ratio,
    /// `true` or `false`.
    Bool,
}

/// One known config key.
#[derive(Debug, Clone, Copy)]
pub struct KeyDef {
    pub name: &'static str,
    pub kind: ValueKind,
    pub default: &'static str,
    pub help: &'static str,
}

/// Every key the monitors accept, with its default. Keys the monitor itself reads are marked
/// "(monitor)"; the others are stored for the daemons that will read them.
pub const KNOWN_KEYS: &[KeyDef] = &[
    KeyDef {
        name: "mon_max_incrementals",
        kind: ValueKind::U64,
        default: "1000",
        help: "(monitor) OSD map incrementals kept for subscribers; older subscribers get a full map",
    },
    KeyDef {
        name: "mon_osd_session_grace",
        kind: ValueKind::Secs,
        default: "5",
        help: "(monitor) an up OSD without a session to the leader for this long is marked down",
    },
    KeyDef {
        name: "mon_osd_down_out_interval",
        kind: ValueKind::Secs,
        default: "600",
        help: "(monitor) a down OSD is marked out after this long (0 disables), unless noout",
    },
    KeyDef {
        name: "mon_osd_min_down_reporters",
        kind: ValueKind::U64,
        default: "2",
        help: "(monitor) distinct OSDs that must report a peer failed before it is marked down (capped at the up OSDs that could report)",
    },
    KeyDef {
        name: "osd_pool_default_size",
        kind: ValueKind::U64,
        default: "3",
        help: "(monitor) replicas of a new pool when `pool create` does not say",
    },
    KeyDef {
        name: "osd_pool_default_min_size",
        kind: ValueKind::U64,
        default: "0",
        help: "(monitor) min_size of a new pool when not given; 0 means size - size/2",
    },
    KeyDef {
        name: "osd_pool_default_pg_num",
        kind: ValueKind::U64,
        default: "32",
        help: "(monitor) pg_num of a new pool when not given",
    },
    KeyDef {
        name: "osd_max_backfills",
        kind: ValueKind::U64,
        default: "2",
        help: "(OSD, runtime) PGs one OSD recovers or backfills at once as their primary; the others wait (recovery_wait, backfill_wait)",
    },
    KeyDef {
        name: "osd_recovery_max_active",
        kind: ValueKind::U64,
        default: "4",
        help: "(OSD, runtime) objects one OSD copies at once for recovery and backfill",
    },
    KeyDef {
        name: "osd_recovery_sleep",
        kind: ValueKind::Secs,
        default: "0",
        help: "(OSD, runtime) pause after every batch of recovered objects",
    },
    KeyDef {
        name: "osd_recovery_op_priority",
        kind: ValueKind::U64,
        default: "12",
        help: "(OSD, runtime) 1-63, against the clients' 63: while clients use an OSD, recovery takes about p/63 of its time (each PG member's recovery that took t is followed by a pause of t*(63/p-1)); 63: no pause",
    },
    KeyDef {
        name: "osd_heartbeat_interval",
        kind: ValueKind::Secs,
        default: "1",
        help: "(OSD) interval of peer heartbeats (Ceph: 6 s; Kelp detects a frozen OSD in seconds)",
    },
    KeyDef {
        name: "osd_heartbeat_grace",
        kind: ValueKind::Secs,
        default: "6",
        help: "(OSD, monitor) a peer silent this long is reported failed; reports older than this expire (Ceph: 20 s)",
    },
    KeyDef {
        name: "osd_scrub_min_interval",
        kind: ValueKind::Secs,
        default: "86400",
        help: "(OSD) a PG is scrubbed on schedule this long after its last scrub, if the load allows",
    },
    KeyDef {
        name: "osd_scrub_max_interval",
        kind: ValueKind::Secs,
        default: "604800",
        help: "(OSD) a PG is scrubbed on schedule this long after its last scrub, whatever the load",
    },
    KeyDef {
        name: "osd_deep_scrub_interval",
        kind: ValueKind::Secs,
        default: "604800",
        help: "(OSD) a PG is deep-scrubbed on schedule this long after its last deep scrub",
    },
    KeyDef {
        name: "osd_scrub_chunk_max",
        kind: ValueKind::U64,
        default: "25",
        help: "(OSD) objects compared per scrub chunk; client writes to a chunk wait while it is compared",
    },
    KeyDef {
        name: "osd_scrub_sleep",
        kind: ValueKind::Secs,
        default: "0",
        help: "(OSD) pause between scrub chunks, to leave the disk to client I/O",
    },
    KeyDef {
        name: "osd_scrub_load_threshold",
        kind: ValueKind::Ratio,
        default: "0.5",
        help: "(OSD) scheduled scrubs wait while the 1-minute load average per CPU is above this",
    },
    KeyDef {
        name: "mon_osd_nearfull_ratio",
        kind: ValueKind::Ratio,
        default: "0.85",
        help: "usage ratio at which an OSD is reported nearfull",
    },
    KeyDef {
        name: "mon_osd_backfillfull_ratio",
        kind: ValueKind::Ratio,
        default: "0.9",
        help: "usage ratio above which an OSD accepts no backfill",
    },
    KeyDef {
        name: "mon_osd_full_ratio",
        kind: ValueKind::Ratio,
        default: "0.95",
        help: "usage ratio at which writes are refused",
    },
    KeyDef {
        name: "osd_max_pg_log_entries",
        kind: ValueKind::U64,
        default: "3000",
        help: "PG log entries each OSD keeps per PG (read when the OSD starts); a member that missed more writes than this is brought back by backfill",
    },
    KeyDef {
        name: "osd_stats_interval",
        kind: ValueKind::Secs,
        default: "2",
        help: "how often each OSD sends its statistics (usage, client I/O, PG states) to the leader monitor",
    },
    KeyDef {
        name: "osd_fast_read",
        kind: ValueKind::Bool,
        default: "false",
        help: "EC pools read all shards and answer with the first k",
    },
];

/// The definition of `key`, if it is known.
pub fn key_def(key: &str) -> Option<&'static KeyDef> {
    KNOWN_KEYS.iter().find(|d| d.name == key)
}

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

/// Validates `value` for `key` and returns its normalised form.
pub fn normalize(key: &str, value: &str) -> Result<String, MonError> {
    let def = key_def(key).ok_or_else(|| MonError::UnknownConfigKey {
        key: key.to_string(),
    })?;
    let bad = |reason: &str| MonError::InvalidConfigValue {
        key: key.to_string(),
        value: value.to_string(),
        reason: reason.to_string(),
    };
    let v = value.trim();
    match def.kind {
        ValueKind::U64 => v
            .parse::<u64>()
            .map(|n| n.to_string())
            .map_err(|_| bad("expected a non-negative integer")),
        ValueKind::Secs => match v.parse::<f64>() {
            Ok(s) if s.is_finite() && s >= 0.0 => Ok(s.to_string()),
            _ => Err(bad("expected a non-negative number of seconds")),
        },
        ValueKind::Ratio => match v.parse::<f64>() {
            Ok(r) if (0.0..=1.0).contains(&r) => Ok(r.to_string()),
            _ => Err(bad("expected a ratio between 0 and 1")),
        },
        ValueKind::Bool => match v {
            "true" | "1" | "yes" | "on" => Ok("true".into()),
            "false" | "0" | "no" | "off" => Ok("false".into()),
            _ => Err(bad("expected true or false")),
        },
    }
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
        for def in KNOWN_KEYS {
            assert_eq!(
                normalize(def.name, def.default).ok().as_deref(),
                Some(def.default),
                "{}",
                def.name
            );
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
