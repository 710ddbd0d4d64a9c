//! Identifiers with Ceph's printed forms (`osd.3`, `1.1a5`), so that operators can paste them
//! between Kelp and Ceph tooling.

use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Serialize};

/// Why a printed identifier could not be parsed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ParseIdError {
    #[error("'{input}' is not a valid {what}: expected {expected}")]
    Invalid {
        input: String,
        what: &'static str,
        expected: &'static str,
    },
}

fn invalid(input: &str, what: &'static str, expected: &'static str) -> ParseIdError {
    ParseIdError::Invalid {
        input: input.to_string(),
        what,
        expected,
    }
}

/// An OSD (object storage daemon) id. Non-negative; printed `osd.N`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct OsdId(pub i32);

impl fmt::Display for OsdId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "osd.{}", self.0)
    }
}

impl FromStr for OsdId {
    type Err = ParseIdError;
    /// Accepts `osd.N` or a bare `N`.
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let digits = s.strip_prefix("osd.").unwrap_or(s);
        match digits.parse::<i32>() {
            Ok(n) if n >= 0 => Ok(OsdId(n)),
            _ => Err(invalid(s, "OSD id", "osd.N or N with N >= 0")),
        }
    }
}

/// A pool id. Ceph stores pool ids as signed 64-bit, but placement hashes them as 32-bit, and
/// real pools are numbered from 1, so Kelp keeps them as `u32`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct PoolId(pub u32);

impl fmt::Display for PoolId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.0)
    }
}

/// A placement group: a pool and a placement seed `ps` in `0..pg_num`. Printed as Ceph prints
/// it, `POOL.PS` with the seed in lower-case hex (`1.1a5`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct PgId {
    pub pool: PoolId,
    pub seed: u32,
}

impl PgId {
    pub fn new(pool: u32, seed: u32) -> Self {
        PgId {
            pool: PoolId(pool),
            seed,
        }
    }
}

impl fmt::Display for PgId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}.{:x}", self.pool.0, self.seed)
    }
}

impl FromStr for PgId {
    type Err = ParseIdError;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let bad = || invalid(s, "PG id", "POOL.SEED_HEX, e.g. 1.1a5");
        let (pool, seed) = s.split_once('.').ok_or_else(bad)?;
        let pool = pool.parse::<u32>().map_err(|_| bad())?;
        if seed.is_empty() || seed.starts_with('+') {
            return Err(bad());
        }
        let seed = u32::from_str_radix(seed, 16).map_err(|_| bad())?;
        Ok(PgId::new(pool, seed))
    }
}

/// A cluster-map epoch. Every change to a map bumps it by one.
#[derive(
    Debug, Clone, Copy, Default, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize,
)]
pub struct Epoch(pub u32);

impl Epoch {
    pub fn next(self) -> Epoch {
        Epoch(self.0 + 1)
    }
}

impl fmt::Display for Epoch {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "e{}", self.0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pg_id_prints_and_parses_like_ceph() {
        let pg = PgId::new(1, 0x1a5);
        assert_eq!(pg.to_string(), "1.1a5");
        assert_eq!("1.1a5".parse::<PgId>().unwrap(), pg);
        assert_eq!("3.0".parse::<PgId>().unwrap(), PgId::new(3, 0));
        for bad in ["", "1", "1.", ".1", "x.1", "1.g", "1.+1", "-1.1"] {
            assert!(bad.parse::<PgId>().is_err(), "{bad:?} should be refused");
        }
    }

    #[test]
    fn osd_id_accepts_both_forms() {
        assert_eq!("osd.12".parse::<OsdId>().unwrap(), OsdId(12));
        assert_eq!("7".parse::<OsdId>().unwrap(), OsdId(7));
        assert_eq!(OsdId(4).to_string(), "osd.4");
        assert!("osd.-1".parse::<OsdId>().is_err());
        assert!("host0".parse::<OsdId>().is_err());
    }
}
