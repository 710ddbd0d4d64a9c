//! The benchmark run: set-up, the timed phase with its progress lines, clean-up, the report.
//!
//! `--concurrency` worker tasks each keep one request in flight until the end of the timed
//! window; every completion goes over a channel to the task that runs `run`, which alone owns
//! the figures and the output, so workers share no locks. A request counts in the figures when
//! it succeeds and *completes* inside the window `[warmup, warmup + duration]` (the rule
//! `s3bench.py` of the Ceph anchor uses, unbiased even for large objects whose latency is a
//! sizeable part of the window); requests still in flight at the end are awaited, so that
//! clean-up knows every key, but not counted. Errors are counted whenever they happen.
//!
//! With `--count N` (put only) there is no time window: the run ends when N objects are
//! acknowledged and its length is the time to the last one. `--segment M` also times each block
//! of M consecutive successes, so an ingest shows whether it slows down as the bucket grows.

use std::collections::BTreeMap;
use std::future::Future;
use std::io::Write;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use tokio::sync::mpsc;
use tokio::task::JoinSet;

use crate::args::{BenchArgs, Format, Mode};
use crate::client::{Endpoint, Payload, S3Client};
use crate::error::BenchError;
use crate::report::{OpKind, Recorder, Report, SegmentReport};

/// How many errors are kept (and shown) with their message; the rest are only counted.
const SHOWN_ERRORS: usize = 5;
/// Pause after a failed request, so that a dead endpoint is not hammered in a tight loop.
const ERROR_BACKOFF: Duration = Duration::from_millis(10);
/// Largest object size: S3's limit for a single PUT.
const MAX_SIZE: u64 = 5 << 30;
/// Default data volume of the object set for get and mixed runs.
const DEFAULT_SET_BYTES: u64 = 256 << 20;
const DEFAULT_MAX_OBJECTS: usize = 1000;
/// The region when neither --region, AWS_REGION nor AWS_DEFAULT_REGION names one.
const DEFAULT_REGION: &str = "us-east-1";
/// The end of the "window" of a `--count` run, which ends when its objects are written.
const NO_END: Duration = Duration::from_secs(10 * 365 * 86_400);

/// The arguments, checked and resolved (environment fallbacks applied, defaults computed).
#[derive(Debug)]
struct Plan {
    mode: Mode,
    endpoint: Endpoint,
    access_key: String,
    secret_key: String,
    region: String,
    bucket: String,
    size: usize,
    concurrency: usize,
    duration: Duration,
    warmup: Duration,
    objects: usize,
    /// put: stop after this many objects instead of after `duration`.
    count: Option<u64>,
    /// Time each block of this many successes.
    segment: Option<u64>,
    get_ratio: f64,
    key_prefix: String,
    keep: bool,
    verify: bool,
    timeout: Duration,
    format: Format,
    seed: u64,
}

impl Plan {
    fn new(args: &BenchArgs) -> Result<Self, BenchError> {
        let endpoint = args
            .endpoint
            .as_deref()
            .filter(|s| !s.trim().is_empty())
            .ok_or(BenchError::MissingEndpoint)?;
        let endpoint = Endpoint::parse(endpoint)?;
        let access_key = args.access_key.clone().filter(|s| !s.is_empty()).ok_or(
            BenchError::MissingCredential {
                which: "access key",
                flag: "access-key",
                env: "AWS_ACCESS_KEY_ID",
            },
        )?;
        let secret_key = args.secret_key.clone().filter(|s| !s.is_empty()).ok_or(
            BenchError::MissingCredential {
                which: "secret key",
                flag: "secret-key",
                env: "AWS_SECRET_ACCESS_KEY",
            },
        )?;
        let invalid =
            |option: &'static str, reason: String| BenchError::InvalidOption { option, reason };
        // AWS_REGION (through clap) wins over AWS_DEFAULT_REGION, as in the AWS CLI.
        let region = args
            .region
            .clone()
            .or_else(|| std::env::var("AWS_DEFAULT_REGION").ok())
            .unwrap_or_else(|| DEFAULT_REGION.to_string());
        let region = region.trim().to_string();
        if region.is_empty() {
            return Err(invalid("region", "must not be empty".into()));
        }
        if args.bucket.is_empty() || args.bucket.contains('/') {
            return Err(invalid(
                "bucket",
                format!("'{}' is not a bucket name", args.bucket),
            ));
        }
        if args.size.0 > MAX_SIZE {
            return Err(invalid(
                "size",
                format!(
                    "{} is larger than S3's 5GiB limit for a single PUT",
                    args.size
                ),
            ));
        }
        let size = args.size.0 as usize;
        if !(1..=100_000).contains(&args.concurrency) {
            return Err(invalid(
                "concurrency",
                "must be between 1 and 100000".into(),
            ));
        }
        if args.duration.is_zero() {
            return Err(invalid("duration", "must be longer than zero".into()));
        }
        if args.timeout.is_zero() {
            return Err(invalid("timeout", "must be longer than zero".into()));
        }
        if !(0.0..=1.0).contains(&args.mixed_get_ratio) {
            return Err(invalid(
                "mixed-get-ratio",
                format!("{} is not between 0.0 and 1.0", args.mixed_get_ratio),
            ));
        }
        if let Some(n) = args.count {
            if args.mode != Mode::Put {
                return Err(invalid(
                    "count",
                    format!("applies to put only, not {}", args.mode),
                ));
            }
            if n == 0 {
                return Err(invalid("count", "must be at least 1".into()));
            }
            if !args.warmup.is_zero() {
                return Err(invalid(
                    "count",
                    "cannot be combined with --warmup (every counted object is timed)".into(),
                ));
            }
        }
        if args.segment == Some(0) {
            return Err(invalid("segment", "must be at least 1".into()));
        }
        let objects = match (args.mode, args.objects) {
            (Mode::Put, _) => 0,
            (_, Some(0)) => return Err(invalid("objects", "must be at least 1".into())),
            (_, Some(n)) => n,
            (_, None) => {
                let fit = (DEFAULT_SET_BYTES / args.size.0.max(1)) as usize;
                fit.min(DEFAULT_MAX_OBJECTS).max(args.concurrency)
            }
        };
        let seed = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos() as u64)
            ^ (u64::from(std::process::id()) << 32);
        let run_id = format!("{:08x}", mix(seed) as u32);
        Ok(Plan {
            mode: args.mode,
            endpoint,
            access_key,
            secret_key,
            region,
            bucket: args.bucket.clone(),
            size,
            concurrency: args.concurrency,
            duration: args.duration,
            warmup: args.warmup,
            objects,
            count: args.count,
            segment: args.segment,
            get_ratio: args.mixed_get_ratio,
            key_prefix: format!("{}{run_id}/", args.prefix),
            keep: args.keep,
            verify: args.verify,
            timeout: args.timeout,
            format: args.format,
            seed,
        })
    }
}

/// SplitMix64's finaliser: spreads a seed over all 64 bits.
fn mix(mut z: u64) -> u64 {
    z = z.wrapping_add(0x9E37_79B9_7F4A_7C15);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// A per-worker random number generator (xorshift64): choices of keys and of GET versus PUT.
struct Rng(u64);

impl Rng {
    fn new(seed: u64) -> Self {
        Rng(mix(seed) | 1)
    }
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
    fn below(&mut self, n: usize) -> usize {
        (self.next() % n.max(1) as u64) as usize
    }
    /// Uniform in [0, 1).
    fn unit(&mut self) -> f64 {
        (self.next() >> 11) as f64 / (1u64 << 53) as f64
    }
}

/// What the workers share: read-only except for the PUT key counter.
struct Shared {
    client: S3Client,
    bucket: String,
    payload: Payload,
    verify: bool,
    timeout: Duration,
    key_prefix: String,
    mode: Mode,
    objects: usize,
    get_ratio: f64,
    next_put: AtomicU64,
    /// put: the key numbers end here (`--count`).
    put_limit: u64,
}

impl Shared {
    fn put_key(&self, n: u64) -> String {
        format!("{}put-{n:010}", self.key_prefix)
    }

    fn set_key(&self, n: usize) -> String {
        format!("{}obj-{n:08}", self.key_prefix)
    }

    /// The keys this run may have written, for clean-up.
    fn written_keys(&self) -> Vec<String> {
        match self.mode {
            Mode::Put => (0..self.next_put.load(Ordering::Relaxed).min(self.put_limit))
                .map(|n| self.put_key(n))
                .collect(),
            Mode::Get | Mode::Mixed => (0..self.objects).map(|n| self.set_key(n)).collect(),
        }
    }

    /// One request, bounded by `--timeout`; returns the object bytes moved.
    async fn request(&self, kind: OpKind, key: &str) -> Result<u64, BenchError> {
        let op = async {
            match kind {
                OpKind::Put => self
                    .client
                    .put_object(&self.bucket, key, &self.payload)
                    .await
                    .map(|()| self.payload.data.len() as u64),
                OpKind::Get => {
                    self.client
                        .get_object(&self.bucket, key, &self.payload.data, self.verify)
                        .await
                }
            }
        };
        tokio::time::timeout(self.timeout, op)
            .await
            .unwrap_or_else(|_| {
                Err(BenchError::Timeout {
                    op: match kind {
                        OpKind::Put => "PutObject",
                        OpKind::Get => "GetObject",
                    },
                    resource: key.to_string(),
                    after: self.timeout,
                })
            })
    }
}

/// One finished request of the timed phase.
struct Completion {
    kind: OpKind,
    started: Instant,
    finished: Instant,
    result: Result<u64, BenchError>,
}

async fn worker(
    shared: Arc<Shared>,
    id: usize,
    seed: u64,
    end: Instant,
    tx: mpsc::UnboundedSender<Completion>,
) {
    let mut rng = Rng::new(seed ^ (id as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15));
    while Instant::now() < end {
        let (kind, key) = match shared.mode {
            Mode::Put => {
                let n = shared.next_put.fetch_add(1, Ordering::Relaxed);
                if n >= shared.put_limit {
                    return;
                }
                (OpKind::Put, shared.put_key(n))
            }
            Mode::Get => (OpKind::Get, shared.set_key(rng.below(shared.objects))),
            Mode::Mixed => {
                let kind = if rng.unit() < shared.get_ratio {
                    OpKind::Get
                } else {
                    OpKind::Put
                };
                (kind, shared.set_key(rng.below(shared.objects)))
            }
        };
        let started = Instant::now();
        let result = shared.request(kind, &key).await;
        let finished = Instant::now();
        let failed = result.is_err();
        let completion = Completion {
            kind,
            started,
            finished,
            result,
        };
        if tx.send(completion).is_err() {
            return;
        }
        if failed {
            tokio::time::sleep(ERROR_BACKOFF).await;
        }
    }
}

/// Runs `op(shared, i)` for i in 0..n with `concurrency` requests in flight. Returns how many
/// failed and the first error; with `stop_on_error`, stops handing out work after one failure.
async fn for_each_index<F, Fut>(
    shared: &Arc<Shared>,
    concurrency: usize,
    n: usize,
    stop_on_error: bool,
    op: F,
) -> (usize, Option<BenchError>)
where
    F: Fn(Arc<Shared>, usize) -> Fut + Send + Sync + 'static,
    Fut: Future<Output = Result<(), BenchError>> + Send,
{
    let next = Arc::new(AtomicUsize::new(0));
    let stop = Arc::new(AtomicBool::new(false));
    let op = Arc::new(op);
    let mut tasks = JoinSet::new();
    for _ in 0..concurrency.min(n) {
        let (shared, next, stop, op) = (shared.clone(), next.clone(), stop.clone(), op.clone());
        tasks.spawn(async move {
            let mut failed = 0usize;
            let mut first = None;
            while !stop.load(Ordering::Relaxed) {
                let i = next.fetch_add(1, Ordering::Relaxed);
                if i >= n {
                    break;
                }
                if let Err(e) = op(shared.clone(), i).await {
                    failed += 1;
                    first.get_or_insert(e);
                    if stop_on_error {
                        stop.store(true, Ordering::Relaxed);
                    }
                }
            }
            (failed, first)
        });
    }
    let mut failed = 0;
    let mut first = None;
    while let Some(joined) = tasks.join_next().await {
        // Our tasks do not panic; a panic would be a bug worth propagating.
        let (f, e) = joined.unwrap_or_else(|e| std::panic::resume_unwind(e.into_panic()));
        failed += f;
        if first.is_none() {
            first = e;
        }
    }
    (failed, first)
}

/// Figures of the last progress interval.
#[derive(Default)]
struct Interval {
    ops: u64,
    bytes: u64,
    errors: u64,
    latency_sum: Duration,
    latency_max: Duration,
}

/// Runs the benchmark that `args` describe and returns its report.
///
/// With `--format text` it writes a header, one progress line per second (like `rados bench`),
/// the first few errors as they happen and the summary to `out`; with `--format json` it writes
/// only the report as JSON. The bucket is created if absent; for `get` and `mixed` the object
/// set is uploaded before the timed phase; the run's objects are deleted at the end unless
/// `--keep`. Fails on bad arguments, when the set-up fails (e.g. the service refuses the
/// credentials), and when every request of the timed phase failed.
pub async fn run(args: &BenchArgs, out: impl Write) -> Result<Report, BenchError> {
    let mut out = out;
    let plan = Plan::new(args)?;
    let text = plan.format == Format::Text;
    let size_name = kelp_types::ByteSize(plan.size as u64);
    if text {
        writeln!(
            out,
            "kelp s3 bench: {} {size_name} objects, {} in flight, {}{} against {}, bucket {}, keys {}*",
            plan.mode,
            plan.concurrency,
            match plan.count {
                Some(n) => format!("until {n} are written"),
                None => format!("{:?}", plan.duration),
            },
            if plan.warmup.is_zero() {
                String::new()
            } else {
                format!(" after {:?} warm-up", plan.warmup)
            },
            plan.endpoint.base,
            plan.bucket,
            plan.key_prefix
        )?;
        out.flush()?;
    }

    let client = S3Client::new(
        plan.endpoint.clone(),
        &plan.access_key,
        &plan.secret_key,
        &plan.region,
        plan.concurrency,
    );
    client.create_bucket(&plan.bucket).await?;
    let payload = Payload::random(plan.size, plan.seed);
    let shared = Arc::new(Shared {
        client,
        bucket: plan.bucket.clone(),
        payload,
        verify: plan.verify,
        timeout: plan.timeout,
        key_prefix: plan.key_prefix.clone(),
        mode: plan.mode,
        objects: plan.objects,
        get_ratio: plan.get_ratio,
        next_put: AtomicU64::new(0),
        put_limit: plan.count.unwrap_or(u64::MAX),
    });

    if plan.objects > 0 {
        if text {
            write!(
                out,
                "preparing {} objects of {size_name} (not timed) ... ",
                plan.objects
            )?;
            out.flush()?;
        }
        let t = Instant::now();
        let (_, first) = for_each_index(
            &shared,
            plan.concurrency,
            plan.objects,
            true,
            |s, i| async move {
                let key = s.set_key(i);
                let r = s.client.put_object(&s.bucket, &key, &s.payload);
                tokio::time::timeout(s.timeout, r)
                    .await
                    .unwrap_or_else(|_| {
                        Err(BenchError::Timeout {
                            op: "PutObject",
                            resource: key,
                            after: s.timeout,
                        })
                    })
            },
        )
        .await;
        if let Some(e) = first {
            if text {
                writeln!(out, "failed")?;
            }
            cleanup(&shared, &plan, text, &mut out).await?;
            return Err(BenchError::Prepare {
                mode: plan.mode.as_str(),
                objects: plan.objects,
                source: Box::new(e),
            });
        }
        if text {
            writeln!(out, "done in {:.1} s", t.elapsed().as_secs_f64())?;
        }
    }

    let timed = measure(&shared, &plan, text, &mut out).await;
    cleanup(&shared, &plan, text, &mut out).await?;
    let report = timed?;
    match plan.format {
        Format::Text => {
            writeln!(out)?;
            report.write_summary(&mut out)?;
        }
        Format::Json => writeln!(out, "{}", report.to_json())?,
    }
    out.flush()?;
    Ok(report)
}

/// The timed phase: workers, progress lines, and the report.
async fn measure(
    shared: &Arc<Shared>,
    plan: &Plan,
    text: bool,
    out: &mut impl Write,
) -> Result<Report, BenchError> {
    let t0 = Instant::now();
    let window_start = t0 + plan.warmup;
    let window_end = window_start + plan.count.map_or(plan.duration, |_| NO_END);
    let (tx, mut rx) = mpsc::unbounded_channel();
    let mut workers = JoinSet::new();
    for id in 0..plan.concurrency {
        workers.spawn(worker(
            shared.clone(),
            id,
            plan.seed,
            window_end,
            tx.clone(),
        ));
    }
    drop(tx);

    let mut by_kind: BTreeMap<OpKind, Recorder> = BTreeMap::new();
    let mut interval = Interval::default();
    // Successes counted so far (inside the window), for the progress lines.
    let mut window_ops = 0u64;
    let mut window_bytes = 0u64;
    let mut successes = 0u64;
    let mut errors = 0u64;
    let mut shown: Vec<BenchError> = Vec::new();
    let mut ticker =
        tokio::time::interval_at((t0 + Duration::from_secs(1)).into(), Duration::from_secs(1));
    ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut ticking = text;
    let mut second = 0u64;
    let mut last_success = window_start;
    let mut segments: Vec<SegmentReport> = Vec::new();
    let mut segment = Interval::default();
    let mut segment_start = window_start;
    if text {
        writeln!(
            out,
            "{:>5} {:>9} {:>10} {:>9} {:>10} {:>11} {:>11} {:>7}",
            "sec", "ops", "ops/s", "MiB/s", "avg MiB/s", "lat avg ms", "lat max ms", "errors"
        )?;
    }
    loop {
        tokio::select! {
            completion = rx.recv() => {
                let Some(c) = completion else { break };
                let rec = by_kind.entry(c.kind).or_default();
                match c.result {
                    Ok(bytes) => {
                        let latency = c.finished - c.started;
                        successes += 1;
                        interval.ops += 1;
                        interval.bytes += bytes;
                        interval.latency_sum += latency;
                        interval.latency_max = interval.latency_max.max(latency);
                        if c.finished >= window_start && c.finished <= window_end {
                            rec.success(bytes, latency);
                            window_ops += 1;
                            window_bytes += bytes;
                            last_success = last_success.max(c.finished);
                            segment.ops += 1;
                            segment.bytes += bytes;
                            if plan.segment == Some(segment.ops) {
                                let done = std::mem::take(&mut segment);
                                close_segment(&mut segments, &done, c.finished - segment_start, false, text, out)?;
                                segment_start = c.finished;
                            }
                        }
                    }
                    Err(e) => {
                        errors += 1;
                        rec.errors += 1;
                        interval.errors += 1;
                        segment.errors += 1;
                        if shown.len() < SHOWN_ERRORS {
                            if text {
                                writeln!(out, "error: {e}")?;
                            }
                            shown.push(e);
                        }
                    }
                }
            }
            _ = ticker.tick(), if ticking => {
                second += 1;
                let now = Instant::now();
                let in_window = now.saturating_duration_since(window_start).as_secs_f64();
                let avg_mib = if in_window > 0.0 {
                    window_bytes as f64 / in_window / (1u64 << 20) as f64
                } else {
                    0.0
                };
                let lat_avg = if interval.ops > 0 {
                    interval.latency_sum.as_secs_f64() * 1e3 / interval.ops as f64
                } else {
                    0.0
                };
                writeln!(
                    out,
                    "{second:>5} {:>9} {:>10.1} {:>9.2} {:>10.2} {:>11.2} {:>11.2} {:>7}{}",
                    window_ops,
                    interval.ops as f64,
                    interval.bytes as f64 / (1u64 << 20) as f64,
                    avg_mib,
                    lat_avg,
                    interval.latency_max.as_secs_f64() * 1e3,
                    errors,
                    if t0 + Duration::from_secs(second) <= window_start {
                        "  (warm-up)"
                    } else {
                        ""
                    },
                )?;
                out.flush()?;
                interval = Interval::default();
                if now + Duration::from_millis(500) >= window_end {
                    ticking = false;
                }
            }
        }
    }
    while let Some(joined) = workers.join_next().await {
        joined.unwrap_or_else(|e| std::panic::resume_unwind(e.into_panic()));
    }

    if successes == 0 && !shown.is_empty() {
        // Keep the first error's structure (its S3 code) for the caller.
        return Err(BenchError::AllFailed {
            errors,
            first: Box::new(shown.swap_remove(0)),
        });
    }

    if plan.segment.is_some() && segment.ops > 0 {
        close_segment(
            &mut segments,
            &segment,
            last_success - segment_start,
            true,
            text,
            out,
        )?;
    }
    let seconds = match plan.count {
        // the time it took to write them all
        Some(_) => (last_success - window_start).as_secs_f64(),
        None => plan.duration.as_secs_f64(),
    };
    let mut total = Recorder::default();
    let mut by_op = BTreeMap::new();
    for (kind, rec) in &mut by_kind {
        total.merge(rec);
        by_op.insert(kind.as_str().to_string(), rec.report(seconds));
    }
    let t = total.report(seconds);
    Ok(Report {
        mode: plan.mode,
        endpoint: plan.endpoint.base.clone(),
        bucket: plan.bucket.clone(),
        size: plan.size as u64,
        concurrency: plan.concurrency,
        objects: plan.objects,
        seconds,
        ops: t.ops,
        bytes: t.bytes,
        errors: t.errors,
        ops_per_s: t.ops_per_s,
        mib_per_s: t.mib_per_s,
        mb_per_s: t.mb_per_s,
        latency_ms: t.latency_ms,
        by_op,
        first_errors: shown.iter().map(ToString::to_string).collect(),
        segments,
    })
}

/// Adds the block of successes `seg` (which took `elapsed`) to `segments`, printing its line in
/// text mode.
fn close_segment(
    segments: &mut Vec<SegmentReport>,
    seg: &Interval,
    elapsed: Duration,
    partial: bool,
    text: bool,
    out: &mut impl Write,
) -> Result<(), BenchError> {
    let s = SegmentReport::new(
        segments.len(),
        (seg.ops, seg.bytes, seg.errors),
        elapsed,
        partial,
    );
    if text {
        writeln!(out, "{}", s.line())?;
    }
    segments.push(s);
    Ok(())
}

/// Deletes every object the run wrote, unless `--keep`. Failures are reported, not fatal.
async fn cleanup(
    shared: &Arc<Shared>,
    plan: &Plan,
    text: bool,
    out: &mut impl Write,
) -> Result<(), BenchError> {
    let keys: Arc<Vec<String>> = Arc::new(shared.written_keys());
    if plan.keep || keys.is_empty() {
        if text && plan.keep && !keys.is_empty() {
            writeln!(out, "kept {} objects under {}", keys.len(), plan.key_prefix)?;
        }
        return Ok(());
    }
    if text {
        write!(out, "cleaning up {} objects ... ", keys.len())?;
        out.flush()?;
    }
    let t = Instant::now();
    let list = keys.clone();
    let (failed, first) =
        for_each_index(shared, plan.concurrency, keys.len(), false, move |s, i| {
            let list = list.clone();
            async move {
                let delete = s.client.delete_object(&s.bucket, &list[i]);
                tokio::time::timeout(s.timeout, delete)
                    .await
                    .unwrap_or_else(|_| {
                        Err(BenchError::Timeout {
                            op: "DeleteObject",
                            resource: list[i].clone(),
                            after: s.timeout,
                        })
                    })
            }
        })
        .await;
    if text {
        match first {
            None => writeln!(out, "done in {:.1} s", t.elapsed().as_secs_f64())?,
            Some(e) => writeln!(
                out,
                "{failed} of {} deletes failed, objects are left under {}; first error: {e}",
                keys.len(),
                plan.key_prefix
            )?,
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[derive(Parser)]
    struct Cli {
        #[command(flatten)]
        bench: BenchArgs,
    }

    fn args(extra: &[&str]) -> BenchArgs {
        let mut v = vec![
            "bench",
            "--endpoint",
            "http://127.0.0.1:9",
            "--access-key",
            "ak",
            "--secret-key",
            "sk",
        ];
        v.extend_from_slice(extra);
        Cli::try_parse_from(v).unwrap().bench
    }

    #[test]
    fn plans_default_the_object_set_to_the_size() {
        let p = Plan::new(&args(&["--size", "64KiB", "-c", "16", "get"])).unwrap();
        assert_eq!(p.objects, 1000);
        let p = Plan::new(&args(&["--size", "32MiB", "-c", "16", "get"])).unwrap();
        assert_eq!(p.objects, 16);
        let p = Plan::new(&args(&["--size", "4MiB", "-c", "4", "mixed"])).unwrap();
        assert_eq!(p.objects, 64);
        let p = Plan::new(&args(&["--objects", "7", "get"])).unwrap();
        assert_eq!(p.objects, 7);
        let p = Plan::new(&args(&["--region", "eu-west-1", "put"])).unwrap();
        assert_eq!(p.region, "eu-west-1");
        assert_eq!(p.objects, 0);
        assert!(p.key_prefix.starts_with("s3bench/") && p.key_prefix.ends_with('/'));
    }

    #[test]
    fn plans_reject_what_cannot_run() {
        for (extra, option) in [
            (&["-c", "0", "put"][..], "concurrency"),
            (&["--duration", "0s", "put"][..], "duration"),
            (
                &["--mixed-get-ratio", "1.5", "mixed"][..],
                "mixed-get-ratio",
            ),
            (&["--objects", "0", "get"][..], "objects"),
            (&["--size", "6GiB", "put"][..], "size"),
            (&["--bucket", "a/b", "put"][..], "bucket"),
            (&["--count", "10", "get"][..], "count"),
            (&["--count", "0", "put"][..], "count"),
            (&["--count", "10", "--warmup", "1s", "put"][..], "count"),
            (&["--segment", "0", "put"][..], "segment"),
        ] {
            match Plan::new(&args(extra)) {
                Err(BenchError::InvalidOption { option: o, .. }) => assert_eq!(o, option),
                other => panic!("{extra:?}: {other:?}"),
            }
        }
        let mut a = args(&["put"]);
        a.endpoint = None;
        assert!(matches!(Plan::new(&a), Err(BenchError::MissingEndpoint)));
        let mut a = args(&["put"]);
        a.secret_key = Some(String::new());
        let e = Plan::new(&a).unwrap_err();
        assert!(e.to_string().contains("AWS_SECRET_ACCESS_KEY"), "{e}");
    }

    #[test]
    fn rng_is_uniform_enough_for_key_choice() {
        let mut rng = Rng::new(42);
        let mut hits = [0u32; 10];
        for _ in 0..100_000 {
            hits[rng.below(10)] += 1;
        }
        assert!(
            hits.iter().all(|&h| (9_000..11_000).contains(&h)),
            "{hits:?}"
        );
        let gets = (0..100_000).filter(|_| rng.unit() < 0.8).count();
        assert!((79_000..81_000).contains(&gets), "{gets}");
    }
}
