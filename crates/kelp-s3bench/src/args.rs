//! Command-line options of `kelp s3 bench`, and the durations they are written in.
//!
//! `BenchArgs` is a clap `Args` struct so that the `kelp` binary can mount it as a subcommand
//! unchanged; the credentials fall back to the usual AWS environment variables, so the same
//! invocation works against Kelp's gateway and any other S3 service.

use std::fmt;
use std::time::Duration;

use kelp_types::ByteSize;
use serde::{Deserialize, Serialize};

/// What the benchmark does with each request.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, clap::ValueEnum, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Mode {
    /// Upload new objects (PutObject), one new key per request.
    Put,
    /// Download objects (GetObject) from a set uploaded before the timed phase.
    Get,
    /// Both, on the same prepared set: GETs with probability --mixed-get-ratio, else PUTs that
    /// overwrite one of the objects.
    Mixed,
}

impl Mode {
    pub fn as_str(self) -> &'static str {
        match self {
            Mode::Put => "put",
            Mode::Get => "get",
            Mode::Mixed => "mixed",
        }
    }
}

impl fmt::Display for Mode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// How the result is printed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Format {
    /// Per-second progress lines, then a summary.
    Text,
    /// Only the report, as one JSON document (no progress lines).
    Json,
}

/// Options of `kelp s3 bench`: an S3 load generator (like warp or COSBench) that works against
/// any S3 service with path-style addressing and SigV4 authentication over plain HTTP.
#[derive(Debug, Clone, clap::Args)]
pub struct BenchArgs {
    /// The workload.
    #[arg(value_enum)]
    pub mode: Mode,

    /// S3 endpoint, e.g. http://127.0.0.1:7480 (plain HTTP; objects are addressed path-style,
    /// http://HOST:PORT/BUCKET/KEY).
    #[arg(long, value_name = "URL", env = "AWS_ENDPOINT_URL")]
    pub endpoint: Option<String>,

    /// Access key id.
    #[arg(
        long,
        value_name = "KEY",
        env = "AWS_ACCESS_KEY_ID",
        hide_env_values = true
    )]
    pub access_key: Option<String>,

    /// Secret access key.
    #[arg(
        long,
        value_name = "SECRET",
        env = "AWS_SECRET_ACCESS_KEY",
        hide_env_values = true
    )]
    pub secret_key: Option<String>,

    /// Region used in the signature (and as the bucket's location when it is created)
    /// [default: $AWS_DEFAULT_REGION, else us-east-1].
    #[arg(long, env = "AWS_REGION")]
    pub region: Option<String>,

    /// Bucket to work in; created if it does not exist (it is never deleted).
    #[arg(long, short = 'b', default_value = "kelp-s3bench")]
    pub bucket: String,

    /// Object size: bytes or with a unit (4KiB, 64KiB, 4MiB, 32MiB, 1GB).
    #[arg(long, short = 's', default_value = "64KiB")]
    pub size: ByteSize,

    /// Requests in flight at once (one connection each).
    #[arg(long, short = 'c', default_value_t = 16)]
    pub concurrency: usize,

    /// Length of the timed phase: 30s, 2m, 1m30s, 500ms, or plain seconds.
    #[arg(long, short = 'd', default_value = "30s", value_parser = parse_duration)]
    pub duration: Duration,

    /// Load applied before the timed phase and left out of the figures.
    #[arg(long, default_value = "0s", value_parser = parse_duration)]
    pub warmup: Duration,

    /// Objects prepared for get and mixed [default: enough for 256 MiB, at least --concurrency,
    /// at most 1000].
    #[arg(long, value_name = "N")]
    pub objects: Option<usize>,

    /// put only: send N PUTs of new keys and stop when all have been answered, instead of
    /// running for --duration (an ingest test, e.g. --count 5000000 --size 1KiB); a failed PUT
    /// counts as an error and is not retried. For large N add
    /// --keep and remove the bucket afterwards (`kelp s3 bucket rm --purge-objects`): the
    /// clean-up would otherwise delete the objects one request at a time.
    #[arg(long, value_name = "N")]
    pub count: Option<u64>,

    /// Also time each block of N consecutive successful requests (with --count 5000000,
    /// --segment 1000000 gives the rate of every million) and compare the last complete block
    /// with the first: the test for slow-downs as a bucket grows.
    #[arg(long, value_name = "N")]
    pub segment: Option<u64>,

    /// Fraction of requests that are GETs in mixed mode (0.0 to 1.0).
    #[arg(long, default_value_t = 0.8, value_name = "RATIO")]
    pub mixed_get_ratio: f64,

    /// Key prefix of every object the run writes; a per-run id follows it.
    #[arg(long, default_value = "s3bench/")]
    pub prefix: String,

    /// Leave the objects in the bucket at the end instead of deleting them.
    #[arg(long)]
    pub keep: bool,

    /// Compare the content of every GET with what was written (sizes are always checked).
    #[arg(long)]
    pub verify: bool,

    /// Give up on a single request after this long; it counts as an error.
    #[arg(long, default_value = "60s", value_parser = parse_duration)]
    pub timeout: Duration,

    /// Output format: set by the caller (`kelp`'s global `--format plain|json`), not parsed
    /// here, so that one `--format` serves every kelp command.
    #[arg(skip = Format::Text)]
    pub format: Format,
}

/// A duration that does not parse.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("'{0}' is not a duration: use a number with a unit such as 500ms, 30s, 2m, 1h or 1m30s")]
pub struct ParseDurationError(pub String);

/// Parses durations as operators write them: `30s`, `2m`, `1h`, `500ms`, `1.5s`, `1m30s`; a plain
/// number means seconds.
pub fn parse_duration(s: &str) -> Result<Duration, ParseDurationError> {
    let err = || ParseDurationError(s.to_string());
    let t = s.trim();
    if t.is_empty() {
        return Err(err());
    }
    if let Ok(secs) = t.parse::<f64>() {
        return Duration::try_from_secs_f64(secs).map_err(|_| err());
    }
    let mut total = Duration::ZERO;
    let mut rest = t;
    while !rest.is_empty() {
        let num_len = rest
            .find(|c: char| !(c.is_ascii_digit() || c == '.'))
            .ok_or_else(err)?;
        let (num, tail) = rest.split_at(num_len);
        let unit_len = tail
            .find(|c: char| c.is_ascii_digit() || c == '.')
            .unwrap_or(tail.len());
        let (unit, tail) = tail.split_at(unit_len);
        let n: f64 = num.parse().map_err(|_| err())?;
        let unit_secs = match unit {
            "ms" => 0.001,
            "s" | "sec" => 1.0,
            "m" | "min" => 60.0,
            "h" => 3600.0,
            _ => return Err(err()),
        };
        total = total
            .checked_add(Duration::try_from_secs_f64(n * unit_secs).map_err(|_| err())?)
            .ok_or_else(err)?;
        rest = tail;
    }
    Ok(total)
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[test]
    fn durations_parse() {
        assert_eq!(parse_duration("30s"), Ok(Duration::from_secs(30)));
        assert_eq!(parse_duration("2m"), Ok(Duration::from_secs(120)));
        assert_eq!(parse_duration("1h"), Ok(Duration::from_secs(3600)));
        assert_eq!(parse_duration("500ms"), Ok(Duration::from_millis(500)));
        assert_eq!(parse_duration("1m30s"), Ok(Duration::from_secs(90)));
        assert_eq!(parse_duration("1.5s"), Ok(Duration::from_millis(1500)));
        assert_eq!(parse_duration("45"), Ok(Duration::from_secs(45)));
        for bad in ["", "s", "30x", "-1s", "1m30", "abc", "1e999"] {
            assert!(parse_duration(bad).is_err(), "{bad:?}");
        }
    }

    #[derive(Parser)]
    struct Cli {
        #[command(flatten)]
        bench: BenchArgs,
    }

    #[test]
    fn flags_parse_with_units() {
        let cli = Cli::try_parse_from([
            "bench",
            "--endpoint",
            "http://127.0.0.1:7480",
            "--access-key",
            "ak",
            "--secret-key",
            "sk",
            "--size",
            "32MiB",
            "-c",
            "4",
            "--duration",
            "2m",
            "--mixed-get-ratio",
            "0.5",
            "mixed",
        ])
        .unwrap();
        let a = cli.bench;
        assert_eq!(a.mode, Mode::Mixed);
        assert_eq!(a.size, ByteSize(32 << 20));
        assert_eq!(a.concurrency, 4);
        assert_eq!(a.duration, Duration::from_secs(120));
        assert_eq!(a.mixed_get_ratio, 0.5);
        assert_eq!(a.endpoint.as_deref(), Some("http://127.0.0.1:7480"));
        assert_eq!(a.format, Format::Text);
        assert!(Cli::try_parse_from(["bench", "--size", "lots", "put"]).is_err());
        assert!(Cli::try_parse_from(["bench", "--duration", "forever", "put"]).is_err());
    }
}
