//! Erasure-code profiles, in Ceph's shape: named sets of `key=value` pairs
//! (`kelp osd erasure-code-profile set NAME k=4 m=2 crush-failure-domain=host`).

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use crate::error::EcError;
use crate::layout::ALIGN;

/// Default chunk size of a stripe (Ceph's `osd_pool_erasure_code_stripe_unit`): each shard
/// holds this many bytes of every full stripe.
pub const DEFAULT_STRIPE_UNIT: u32 = 4096;

/// Most shards (`k + m`) a profile may have: CRUSH must find that many failure domains, and
/// every write goes to all of them.
pub const MAX_SHARDS: u32 = 32;

/// Largest stripe unit accepted (a partial-stripe write reads and rewrites up to this much per
/// shard).
const MAX_STRIPE_UNIT: u32 = 1 << 20;

/// The code used. Kelp has one: systematic Reed-Solomon over GF(2^16). Ceph's names for its
/// Reed-Solomon techniques are accepted so that profiles written for Ceph keep working; the
/// bytes on disk are Kelp's own either way.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum Technique {
    ReedSolomon,
}

/// A validated erasure-code profile.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Profile {
    /// Data shards per stripe.
    pub k: u32,
    /// Parity shards per stripe: this many shards may be lost without losing data.
    pub m: u32,
    /// Bytes of each full stripe held by one shard (a multiple of [`ALIGN`]).
    pub stripe_unit: u32,
    pub technique: Technique,
    /// CRUSH bucket type each shard must be in a different one of (`host`, `osd`, `rack`...).
    pub failure_domain: String,
    /// Only OSDs of this device class (`ssd`, `hdd`...) hold shards, if set.
    pub device_class: Option<String>,
    /// CRUSH root the rule starts from.
    pub root: String,
}

impl Default for Profile {
    /// Ceph's default profile: `k=2 m=2`, one shard per host.
    fn default() -> Self {
        Profile {
            k: 2,
            m: 2,
            stripe_unit: DEFAULT_STRIPE_UNIT,
            technique: Technique::ReedSolomon,
            failure_domain: "host".into(),
            device_class: None,
            root: "default".into(),
        }
    }
}

impl Profile {
    /// Parses `key=value` pairs; keys not given take the defaults of [`Profile::default`].
    /// Unknown keys and out-of-range values are refused with the reason.
    pub fn from_pairs<'a>(
        pairs: impl IntoIterator<Item = (&'a str, &'a str)>,
    ) -> Result<Profile, EcError> {
        let mut p = Profile::default();
        let bad = |msg: String| EcError::InvalidProfile(msg);
        for (key, value) in pairs {
            let value = value.trim();
            let int = |what: &str| -> Result<u32, EcError> {
                value
                    .parse::<u32>()
                    .map_err(|_| bad(format!("{what}={value:?} is not a whole number")))
            };
            match key.trim() {
                "k" => p.k = int("k")?,
                "m" => p.m = int("m")?,
                "stripe_unit" => p.stripe_unit = parse_size(value)?,
                "crush-failure-domain" => p.failure_domain = nonempty(key, value)?,
                "crush-device-class" => {
                    p.device_class = (!value.is_empty()).then(|| value.to_string())
                }
                "crush-root" => p.root = nonempty(key, value)?,
                "plugin" => match value {
                    "jerasure" | "isa" | "kelp" => {}
                    other => {
                        return Err(bad(format!(
                            "plugin={other} is not available (Kelp codes with Reed-Solomon; \
                             plugin=jerasure, isa or kelp all select it)"
                        )));
                    }
                },
                "technique" => match value {
                    "reed_sol_van" | "reed_sol" | "rs" => {}
                    other => {
                        return Err(bad(format!(
                            "technique={other} is not available (reed_sol_van is)"
                        )));
                    }
                },
                other => {
                    return Err(bad(format!(
                        "unknown key {other:?} (known: k, m, stripe_unit, crush-failure-domain, \
                         crush-device-class, crush-root, plugin, technique)"
                    )));
                }
            }
        }
        p.validate()?;
        Ok(p)
    }

    /// Parses `k=4 m=2 ...` words as typed on the command line.
    pub fn from_words<S: AsRef<str>>(words: &[S]) -> Result<Profile, EcError> {
        let mut pairs = Vec::new();
        for w in words {
            let w = w.as_ref();
            let (k, v) = w.split_once('=').ok_or_else(|| {
                EcError::InvalidProfile(format!("{w:?} is not key=value (e.g. k=4 m=2)"))
            })?;
            pairs.push((k, v));
        }
        Profile::from_pairs(pairs)
    }

    fn validate(&self) -> Result<(), EcError> {
        let bad = |msg: String| Err(EcError::InvalidProfile(msg));
        if self.k < 1 {
            return bad("k must be at least 1".into());
        }
        if self.m < 1 {
            return bad("m must be at least 1 (with m=0 nothing can be lost: use a replicated pool of size 1)".into());
        }
        if self.k + self.m > MAX_SHARDS {
            return bad(format!(
                "k+m = {} is more than the {MAX_SHARDS} shards Kelp supports",
                self.k + self.m
            ));
        }
        if self.stripe_unit == 0
            || !self.stripe_unit.is_multiple_of(ALIGN as u32)
            || self.stripe_unit > MAX_STRIPE_UNIT
        {
            return bad(format!(
                "stripe_unit={} must be a multiple of {ALIGN} bytes between {ALIGN} and {MAX_STRIPE_UNIT}",
                self.stripe_unit
            ));
        }
        Ok(())
    }

    /// Shards per object (`k + m`): the pool's `size`.
    pub fn size(&self) -> u32 {
        self.k + self.m
    }

    /// Default `min_size` of a pool with this profile, as Ceph's: `k + 1` (a write still has
    /// one shard to spare), or `k` when `m = 1` (else one lost shard would stop all I/O).
    pub fn default_min_size(&self) -> u32 {
        self.k + 1.min(self.m - 1)
    }

    /// Raw bytes stored per logical byte, for large objects: `(k + m) / k`.
    pub fn overhead(&self) -> f64 {
        f64::from(self.k + self.m) / f64::from(self.k)
    }

    /// The profile as Ceph prints it (`kelp osd erasure-code-profile get`): every key, sorted.
    pub fn to_pairs(&self) -> BTreeMap<String, String> {
        let mut out = BTreeMap::new();
        out.insert("k".into(), self.k.to_string());
        out.insert("m".into(), self.m.to_string());
        out.insert("stripe_unit".into(), self.stripe_unit.to_string());
        out.insert("plugin".into(), "kelp".into());
        out.insert("technique".into(), "reed_sol_van".into());
        out.insert("crush-failure-domain".into(), self.failure_domain.clone());
        out.insert("crush-root".into(), self.root.clone());
        out.insert(
            "crush-device-class".into(),
            self.device_class.clone().unwrap_or_default(),
        );
        out
    }
}

fn nonempty(key: &str, value: &str) -> Result<String, EcError> {
    if value.is_empty() {
        Err(EcError::InvalidProfile(format!("{key} may not be empty")))
    } else {
        Ok(value.to_string())
    }
}

/// `4096`, `4K`, `4KiB`, `64k`, `1M` → bytes.
fn parse_size(s: &str) -> Result<u32, EcError> {
    let lower = s.to_ascii_lowercase();
    let (digits, mult) = if let Some(d) = lower
        .strip_suffix("kib")
        .or_else(|| lower.strip_suffix("kb"))
        .or_else(|| lower.strip_suffix('k'))
    {
        (d, 1024)
    } else if let Some(d) = lower
        .strip_suffix("mib")
        .or_else(|| lower.strip_suffix("mb"))
        .or_else(|| lower.strip_suffix('m'))
    {
        (d, 1024 * 1024)
    } else {
        (lower.as_str(), 1)
    };
    digits
        .trim()
        .parse::<u32>()
        .ok()
        .and_then(|n| n.checked_mul(mult))
        .ok_or_else(|| {
            EcError::InvalidProfile(format!("stripe_unit={s:?} is not a size (e.g. 4096 or 4K)"))
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_ceph_words() {
        let p = Profile::from_words(&[
            "k=4",
            "m=2",
            "crush-failure-domain=osd",
            "plugin=jerasure",
            "technique=reed_sol_van",
            "stripe_unit=8K",
        ])
        .unwrap();
        assert_eq!((p.k, p.m, p.stripe_unit), (4, 2, 8192));
        assert_eq!(p.failure_domain, "osd");
        assert_eq!(p.size(), 6);
        assert_eq!(p.default_min_size(), 5);
        let again = Profile::from_pairs(p.to_pairs().iter().map(|(k, v)| (k.as_str(), v.as_str())))
            .unwrap();
        assert_eq!(again, p);
    }

    #[test]
    fn defaults_are_cephs() {
        let p = Profile::from_words::<&str>(&[]).unwrap();
        assert_eq!((p.k, p.m, p.stripe_unit), (2, 2, 4096));
        assert_eq!(p.failure_domain, "host");
        let one = Profile::from_words(&["k=3", "m=1"]).unwrap();
        assert_eq!(one.default_min_size(), 3);
    }

    #[test]
    fn refuses_bad_profiles() {
        for words in [
            vec!["k=0"],
            vec!["m=0"],
            vec!["k=30", "m=3"],
            vec!["stripe_unit=100"],
            vec!["stripe_unit=4M"],
            vec!["k=two"],
            vec!["size=3"],
            vec!["plugin=shec"],
            vec!["technique=cauchy_good"],
            vec!["k4"],
            vec!["crush-failure-domain="],
        ] {
            let err = Profile::from_words(&words).unwrap_err();
            assert!(matches!(err, EcError::InvalidProfile(_)), "{words:?}");
        }
    }
}
