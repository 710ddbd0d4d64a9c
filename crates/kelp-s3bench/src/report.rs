//! What a run measured: the recorder that collects completions, and the `Report` built from it.
//!
//! Latencies are kept exactly (one `u64` of nanoseconds per successful request: 24 MB for three
//! million requests) and sorted once at the end, so percentiles are exact nearest-rank values
//! rather than histogram approximations.

use std::collections::BTreeMap;
use std::io::{self, Write};
use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::args::Mode;

const MIB: f64 = (1u64 << 20) as f64;

/// The kind of one benchmark request.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) enum OpKind {
    Put,
    Get,
}

impl OpKind {
    pub(crate) fn as_str(self) -> &'static str {
        match self {
            OpKind::Put => "put",
            OpKind::Get => "get",
        }
    }
}

/// Successful requests, bytes, latencies and errors of one kind of request.
#[derive(Debug, Default)]
pub(crate) struct Recorder {
    pub ops: u64,
    pub bytes: u64,
    pub errors: u64,
    latencies_ns: Vec<u64>,
}

impl Recorder {
    pub(crate) fn success(&mut self, bytes: u64, latency: Duration) {
        self.ops += 1;
        self.bytes += bytes;
        self.latencies_ns
            .push(u64::try_from(latency.as_nanos()).unwrap_or(u64::MAX));
    }

    pub(crate) fn merge(&mut self, other: &Recorder) {
        self.ops += other.ops;
        self.bytes += other.bytes;
        self.errors += other.errors;
        self.latencies_ns.extend_from_slice(&other.latencies_ns);
    }

    pub(crate) fn report(&mut self, seconds: f64) -> OpReport {
        self.latencies_ns.sort_unstable();
        let per_s = |x: f64| if seconds > 0.0 { x / seconds } else { 0.0 };
        OpReport {
            ops: self.ops,
            bytes: self.bytes,
            errors: self.errors,
            ops_per_s: per_s(self.ops as f64),
            mib_per_s: per_s(self.bytes as f64 / MIB),
            mb_per_s: per_s(self.bytes as f64 / 1e6),
            latency_ms: LatencyMs::of_sorted(&self.latencies_ns),
        }
    }
}

/// The nearest-rank percentile `p` (0 < p ≤ 100) of sorted values: the smallest value that at
/// least p% of the values do not exceed. `None` for no values.
pub fn percentile(sorted: &[u64], p: f64) -> Option<u64> {
    if sorted.is_empty() {
        return None;
    }
    let rank = (p / 100.0 * sorted.len() as f64).ceil() as usize;
    Some(sorted[rank.clamp(1, sorted.len()) - 1])
}

/// Request latencies in milliseconds; all zero when no request succeeded.
#[derive(Debug, Clone, Copy, PartialEq, Default, Serialize, Deserialize)]
pub struct LatencyMs {
    pub avg: f64,
    pub p50: f64,
    pub p99: f64,
    pub max: f64,
}

impl LatencyMs {
    fn of_sorted(ns: &[u64]) -> Self {
        let ms = |v: Option<u64>| v.map_or(0.0, |n| n as f64 / 1e6);
        let avg = if ns.is_empty() {
            0.0
        } else {
            ns.iter().map(|&n| n as f64).sum::<f64>() / ns.len() as f64 / 1e6
        };
        LatencyMs {
            avg,
            p50: ms(percentile(ns, 50.0)),
            p99: ms(percentile(ns, 99.0)),
            max: ms(ns.last().copied()),
        }
    }
}

/// The figures of one kind of request (`put` or `get`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct OpReport {
    /// Requests that succeeded and completed inside the timed window.
    pub ops: u64,
    /// Object bytes those requests moved.
    pub bytes: u64,
    /// Requests that failed during the run (warm-up and timed phase).
    pub errors: u64,
    pub ops_per_s: f64,
    /// MiB (2^20 bytes) per second.
    pub mib_per_s: f64,
    /// MB (10^6 bytes) per second, as `s3bench.py` and warp print it.
    pub mb_per_s: f64,
    pub latency_ms: LatencyMs,
}

/// The result of one benchmark run. `kelp s3 bench --format json` prints it as JSON.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Report {
    pub mode: Mode,
    pub endpoint: String,
    pub bucket: String,
    /// Object size in bytes.
    pub size: u64,
    pub concurrency: usize,
    /// Objects prepared for get and mixed runs; 0 for put.
    pub objects: usize,
    /// Length of the timed window; requests completing inside it are counted.
    pub seconds: f64,
    /// Successful requests of every kind.
    pub ops: u64,
    /// Object bytes moved by them.
    pub bytes: u64,
    /// Failed requests.
    pub errors: u64,
    pub ops_per_s: f64,
    pub mib_per_s: f64,
    pub mb_per_s: f64,
    pub latency_ms: LatencyMs,
    /// The same figures per kind of request (`put`, `get`); mixed runs have both.
    pub by_op: BTreeMap<String, OpReport>,
    /// The first few errors, as messages.
    pub first_errors: Vec<String>,
    /// With `--segment N`: each block of N consecutive successes, in order; the last one may
    /// be shorter (`partial`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub segments: Vec<SegmentReport>,
}

/// One block of consecutive successful requests (`--segment`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SegmentReport {
    /// 0 for the first block.
    pub index: usize,
    /// Successes in the block (the segment size, except in a partial last block).
    pub ops: u64,
    /// Requests that failed while the block was written.
    pub errors: u64,
    /// From the block's first request's start (the previous block's last completion) to its
    /// last completion.
    pub seconds: f64,
    pub ops_per_s: f64,
    pub mib_per_s: f64,
    /// The run ended before the block was complete.
    pub partial: bool,
}

impl SegmentReport {
    pub(crate) fn new(
        index: usize,
        (ops, bytes, errors): (u64, u64, u64),
        elapsed: Duration,
        partial: bool,
    ) -> Self {
        let seconds = elapsed.as_secs_f64();
        let per_s = |x: f64| if seconds > 0.0 { x / seconds } else { 0.0 };
        SegmentReport {
            index,
            ops,
            errors,
            seconds,
            ops_per_s: per_s(ops as f64),
            mib_per_s: per_s(bytes as f64 / MIB),
            partial,
        }
    }

    /// The progress line printed when the block completes.
    pub(crate) fn line(&self) -> String {
        format!(
            "segment {:>3}{}: {} ops in {:.1} s, {:.1} ops/s, {:.2} MiB/s, {} errors",
            self.index + 1,
            if self.partial { " (partial)" } else { "" },
            self.ops,
            self.seconds,
            self.ops_per_s,
            self.mib_per_s,
            self.errors
        )
    }
}

impl Report {
    /// The rate of the last complete segment relative to the first, as a signed fraction
    /// (-0.05: 5% slower); `None` with fewer than two complete segments.
    pub fn last_vs_first(&self) -> Option<f64> {
        let mut full = self.segments.iter().filter(|s| !s.partial);
        let first = full.next()?;
        let last = full.next_back()?;
        (first.ops_per_s > 0.0).then(|| last.ops_per_s / first.ops_per_s - 1.0)
    }
}

impl Report {
    /// The report as pretty-printed JSON.
    pub fn to_json(&self) -> String {
        // A struct of numbers, strings and maps with string keys always serialises.
        serde_json::to_string_pretty(self).expect("Report serialises to JSON")
    }

    /// The human summary that `kelp s3 bench` prints after the progress lines.
    pub fn write_summary(&self, mut w: impl Write) -> io::Result<()> {
        writeln!(
            w,
            "Summary: {} of {} objects, {} in flight, {:.1} s, {} bucket {}",
            self.mode,
            kelp_types::ByteSize(self.size),
            self.concurrency,
            self.seconds,
            self.endpoint,
            self.bucket
        )?;
        writeln!(
            w,
            "  {:<6} {:>9} {:>10} {:>9} {:>9} {:>8} {:>8} {:>8} {:>8} {:>7}",
            "op", "ops", "ops/s", "MiB/s", "MB/s", "avg ms", "p50 ms", "p99 ms", "max ms", "errors"
        )?;
        let mut line = |name: &str, r: &OpReport| {
            writeln!(
                w,
                "  {name:<6} {:>9} {:>10.1} {:>9.2} {:>9.2} {:>8.2} {:>8.2} {:>8.2} {:>8.2} {:>7}",
                r.ops,
                r.ops_per_s,
                r.mib_per_s,
                r.mb_per_s,
                r.latency_ms.avg,
                r.latency_ms.p50,
                r.latency_ms.p99,
                r.latency_ms.max,
                r.errors
            )
        };
        line("total", &self.total())?;
        if self.by_op.len() > 1 {
            for (name, r) in &self.by_op {
                line(name, r)?;
            }
        }
        if !self.segments.is_empty() {
            writeln!(w, "  segments:")?;
            for s in &self.segments {
                writeln!(w, "    {}", s.line())?;
            }
            if let Some(d) = self.last_vs_first() {
                writeln!(
                    w,
                    "  last complete segment vs first: {:+.1}% ops/s",
                    d * 100.0
                )?;
            }
        }
        if !self.first_errors.is_empty() {
            writeln!(w, "  first errors:")?;
            for e in &self.first_errors {
                writeln!(w, "    {e}")?;
            }
        }
        Ok(())
    }

    fn total(&self) -> OpReport {
        OpReport {
            ops: self.ops,
            bytes: self.bytes,
            errors: self.errors,
            ops_per_s: self.ops_per_s,
            mib_per_s: self.mib_per_s,
            mb_per_s: self.mb_per_s,
            latency_ms: self.latency_ms,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nearest_rank_percentiles() {
        assert_eq!(percentile(&[], 50.0), None);
        assert_eq!(percentile(&[7], 50.0), Some(7));
        assert_eq!(percentile(&[7], 99.0), Some(7));
        let v: Vec<u64> = (1..=100).collect();
        assert_eq!(percentile(&v, 50.0), Some(50));
        assert_eq!(percentile(&v, 99.0), Some(99));
        assert_eq!(percentile(&v, 100.0), Some(100));
        assert_eq!(percentile(&v, 0.1), Some(1));
        let v: Vec<u64> = (1..=1000).collect();
        assert_eq!(percentile(&v, 99.0), Some(990));
        assert_eq!(percentile(&[1, 2, 3, 4], 50.0), Some(2));
        assert_eq!(percentile(&[1, 2, 3], 50.0), Some(2));
    }

    #[test]
    fn recorder_computes_rates_and_latencies() {
        let mut r = Recorder::default();
        for ms in [10u64, 20, 30, 40] {
            r.success(1 << 20, Duration::from_millis(ms));
        }
        r.errors = 1;
        let rep = r.report(2.0);
        assert_eq!(rep.ops, 4);
        assert_eq!(rep.ops_per_s, 2.0);
        assert_eq!(rep.mib_per_s, 2.0);
        assert!((rep.mb_per_s - 2.097152).abs() < 1e-9);
        assert_eq!(
            rep.latency_ms,
            LatencyMs {
                avg: 25.0,
                p50: 20.0,
                p99: 40.0,
                max: 40.0
            }
        );
        assert_eq!(
            Recorder::default().report(1.0).latency_ms,
            LatencyMs::default()
        );
    }

    fn sample() -> Report {
        let mut put = Recorder::default();
        put.success(65536, Duration::from_millis(5));
        let mut get = Recorder::default();
        get.success(65536, Duration::from_millis(3));
        get.errors = 2;
        let mut all = Recorder::default();
        all.merge(&put);
        all.merge(&get);
        let total = all.report(1.0);
        Report {
            mode: Mode::Mixed,
            endpoint: "http://127.0.0.1:7480".into(),
            bucket: "b".into(),
            size: 65536,
            concurrency: 4,
            objects: 16,
            seconds: 1.0,
            ops: total.ops,
            bytes: total.bytes,
            errors: total.errors,
            ops_per_s: total.ops_per_s,
            mib_per_s: total.mib_per_s,
            mb_per_s: total.mb_per_s,
            latency_ms: total.latency_ms,
            by_op: BTreeMap::from([
                ("put".to_string(), put.report(1.0)),
                ("get".to_string(), get.report(1.0)),
            ]),
            first_errors: vec!["GetObject x: boom".into()],
            segments: Vec::new(),
        }
    }

    #[test]
    fn segments_compare_the_last_complete_block_with_the_first() {
        let mut r = sample();
        assert_eq!(r.last_vs_first(), None);
        let v: serde_json::Value = serde_json::from_str(&r.to_json()).unwrap();
        assert!(v.get("segments").is_none(), "{v}");
        let seg = |i, secs: u64, partial| {
            SegmentReport::new(i, (1000, 1000 << 10, 0), Duration::from_secs(secs), partial)
        };
        r.segments = vec![seg(0, 10, false)];
        assert_eq!(r.last_vs_first(), None);
        // the partial last block does not count
        r.segments = vec![seg(0, 10, false), seg(1, 8, false), seg(2, 50, true)];
        assert!((r.last_vs_first().unwrap() - 0.25).abs() < 1e-9);
        assert_eq!(r.segments[0].ops_per_s, 100.0);
        let v: serde_json::Value = serde_json::from_str(&r.to_json()).unwrap();
        assert_eq!(v["segments"][1]["ops_per_s"], 125.0);
        assert_eq!(v["segments"][2]["partial"], true);
        let mut out = Vec::new();
        r.write_summary(&mut out).unwrap();
        let s = String::from_utf8(out).unwrap();
        assert!(
            s.contains("segment   3 (partial): 1000 ops in 50.0 s"),
            "{s}"
        );
        assert!(
            s.contains("last complete segment vs first: +25.0% ops/s"),
            "{s}"
        );
    }

    #[test]
    fn json_has_the_documented_shape() {
        let v: serde_json::Value = serde_json::from_str(&sample().to_json()).unwrap();
        for key in [
            "mode",
            "endpoint",
            "bucket",
            "size",
            "concurrency",
            "objects",
            "seconds",
            "ops",
            "bytes",
            "errors",
            "ops_per_s",
            "mib_per_s",
            "mb_per_s",
            "latency_ms",
            "by_op",
            "first_errors",
        ] {
            assert!(v.get(key).is_some(), "missing {key}: {v}");
        }
        assert_eq!(v["mode"], "mixed");
        assert_eq!(v["ops"], 2);
        assert_eq!(v["errors"], 2);
        assert_eq!(v["latency_ms"]["p50"], 3.0);
        assert_eq!(v["latency_ms"]["max"], 5.0);
        for k in ["avg", "p50", "p99", "max"] {
            assert!(v["latency_ms"][k].is_f64(), "{k}");
        }
        assert_eq!(v["by_op"]["put"]["ops"], 1);
        assert_eq!(v["by_op"]["get"]["errors"], 2);
        assert_eq!(v["by_op"]["get"]["latency_ms"]["p99"], 3.0);
        // And it reads back (floats may differ in the last bit through JSON).
        let back: Report = serde_json::from_str(&sample().to_json()).unwrap();
        assert_eq!(back.by_op.keys().collect::<Vec<_>>(), ["get", "put"]);
        assert_eq!((back.ops, back.mode), (2, Mode::Mixed));
    }

    #[test]
    fn summary_names_every_kind_for_mixed() {
        let mut out = Vec::new();
        sample().write_summary(&mut out).unwrap();
        let s = String::from_utf8(out).unwrap();
        assert!(
            s.starts_with("Summary: mixed of 64KiB objects, 4 in flight"),
            "{s}"
        );
        for needle in [
            "total",
            "put",
            "get",
            "ops/s",
            "MiB/s",
            "p99",
            "GetObject x: boom",
        ] {
            assert!(s.contains(needle), "{needle} missing from {s}");
        }
    }
}
