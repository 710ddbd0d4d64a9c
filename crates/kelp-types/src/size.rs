//! Byte sizes as operators write them (`4096`, `4KiB`, `64MiB`, `1G`).

use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Serialize};

/// A number of bytes. Parses plain integers and binary (`KiB`, `MiB`, `GiB`, `TiB`) or decimal
/// (`KB`/`K`, `MB`/`M`, …) suffixes; single-letter suffixes are binary, as in Ceph's tools.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct ByteSize(pub u64);

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "'{0}' is not a byte size: use a number with an optional unit such as 4096, 4KiB, 64MiB, 1GB"
)]
pub struct ParseSizeError(pub String);

impl FromStr for ByteSize {
    type Err = ParseSizeError;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let t = s.trim();
        let split = t
            .find(|c: char| !(c.is_ascii_digit() || c == '.'))
            .unwrap_or(t.len());
        let (num, unit) = t.split_at(split);
        let mult: u64 = match unit.trim().to_ascii_lowercase().as_str() {
            "" | "b" => 1,
            "k" | "kib" => 1 << 10,
            "m" | "mib" => 1 << 20,
            "g" | "gib" => 1 << 30,
            "t" | "tib" => 1 << 40,
            "kb" => 1_000,
            "mb" => 1_000_000,
            "gb" => 1_000_000_000,
            "tb" => 1_000_000_000_000,
            _ => return Err(ParseSizeError(s.to_string())),
        };
        if num.is_empty() {
            return Err(ParseSizeError(s.to_string()));
        }
        if let Ok(n) = num.parse::<u64>() {
            return n
                .checked_mul(mult)
                .map(ByteSize)
                .ok_or_else(|| ParseSizeError(s.to_string()));
        }
        let f: f64 = num.parse().map_err(|_| ParseSizeError(s.to_string()))?;
        let bytes = f * mult as f64;
        if !(0.0..1.8e19).contains(&bytes) {
            return Err(ParseSizeError(s.to_string()));
        }
        Ok(ByteSize(bytes.round() as u64))
    }
}

impl fmt::Display for ByteSize {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        const UNITS: [(&str, u64); 4] = [
            ("TiB", 1 << 40),
            ("GiB", 1 << 30),
            ("MiB", 1 << 20),
            ("KiB", 1 << 10),
        ];
        for (name, unit) in UNITS {
            if self.0 >= unit && self.0.is_multiple_of(unit) {
                return write!(f, "{}{}", self.0 / unit, name);
            }
        }
        write!(f, "{}B", self.0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_units() {
        assert_eq!("4096".parse::<ByteSize>().unwrap(), ByteSize(4096));
        assert_eq!("4KiB".parse::<ByteSize>().unwrap(), ByteSize(4096));
        assert_eq!("4k".parse::<ByteSize>().unwrap(), ByteSize(4096));
        assert_eq!("64MiB".parse::<ByteSize>().unwrap(), ByteSize(64 << 20));
        assert_eq!("1GB".parse::<ByteSize>().unwrap(), ByteSize(1_000_000_000));
        assert_eq!("1.5KiB".parse::<ByteSize>().unwrap(), ByteSize(1536));
        for bad in ["", "KiB", "4 parsecs", "-1", "99999999999999999999TiB"] {
            assert!(bad.parse::<ByteSize>().is_err(), "{bad:?}");
        }
        assert_eq!(ByteSize(4 << 20).to_string(), "4MiB");
        assert_eq!(ByteSize(1000).to_string(), "1000B");
    }
}
