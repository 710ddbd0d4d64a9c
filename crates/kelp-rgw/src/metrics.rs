//! The gateway's Prometheus metrics (`/metrics`, see `kelp_metrics`).
//!
//! Every request is counted by S3 operation (named from its method, path shape and
//! sub-resource: a closed set, [`s3_operation`]) and status class, with its bytes and its
//! latency (until the answer's headers are sent; a body streamed after that is not timed).
//! Per-bucket traffic is kept in memory and exported for the top K buckets by bytes only
//! (`metrics_top_k`; the rest add up in `bucket="other"`), so no label grows with the number
//! of buckets; at most [`MAX_TRACKED_BUCKETS`] buckets are tracked by name.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Instant;

use kelp_metrics::{
    CounterVec, Gauge, HistogramVec, LATENCY_BUCKETS, MetricDef, MetricTable, MetricType as T,
    Registry, Snapshot,
};

pub static METRICS: &[MetricDef] = &[
    MetricDef {
        name: "kelp_rgw_requests",
        kind: T::Counter,
        help: "S3 requests answered, by S3 operation and status class (2xx, 3xx, 4xx, 5xx).",
        labels: &["op", "status"],
    },
    MetricDef {
        name: "kelp_rgw_received_bytes",
        kind: T::Counter,
        help: "Request body bytes received (as announced by Content-Length), by S3 operation.",
        labels: &["op"],
    },
    MetricDef {
        name: "kelp_rgw_sent_bytes",
        kind: T::Counter,
        help: "Response body bytes sent (as announced by Content-Length), by S3 operation.",
        labels: &["op"],
    },
    MetricDef {
        name: "kelp_rgw_request_latency_seconds",
        kind: T::Histogram,
        help: "Time from a request's arrival to its answer's headers, by S3 operation.",
        labels: &["op"],
    },
    MetricDef {
        name: "kelp_rgw_requests_in_flight",
        kind: T::Gauge,
        help: "S3 requests being served now.",
        labels: &[],
    },
    MetricDef {
        name: "kelp_rgw_bucket_requests",
        kind: T::Counter,
        help: "Requests to the busiest buckets (top K by bytes, metrics_top_k; the rest in bucket=\"other\").",
        labels: &["bucket"],
    },
    MetricDef {
        name: "kelp_rgw_bucket_bytes",
        kind: T::Counter,
        help: "Bytes received and sent for the busiest buckets (top K by bytes; the rest in bucket=\"other\"), by direction (in, out).",
        labels: &["bucket", "direction"],
    },
    // bucket usage (crate::usage, counted in the background): 7..=12
    MetricDef {
        name: "kelp_rgw_bucket_stored_bytes",
        kind: T::Gauge,
        help: "Bytes stored in the largest buckets (top K by stored bytes, metrics_top_k; the rest summed in bucket=\"other\"), as their index records them.",
        labels: &["bucket"],
    },
    MetricDef {
        name: "kelp_rgw_bucket_objects",
        kind: T::Gauge,
        help: "Objects in the largest buckets (the same top K by stored bytes; the rest summed in bucket=\"other\").",
        labels: &["bucket"],
    },
    MetricDef {
        name: "kelp_rgw_buckets",
        kind: T::Gauge,
        help: "Buckets whose usage has been counted (every bucket of the cluster, after the first full pass).",
        labels: &[],
    },
    MetricDef {
        name: "kelp_rgw_stored_bytes",
        kind: T::Gauge,
        help: "Bytes stored in all buckets together.",
        labels: &[],
    },
    MetricDef {
        name: "kelp_rgw_objects",
        kind: T::Gauge,
        help: "Objects in all buckets together.",
        labels: &[],
    },
    MetricDef {
        name: "kelp_rgw_usage_age_seconds",
        kind: T::Gauge,
        help: "Time since bucket usage was last counted (every rgw_usage_interval for changed buckets; all buckets every 30 passes).",
        labels: &[],
    },
];

/// S3 operations that change what a bucket holds: a successful one marks its bucket for
/// the next usage pass ([`crate::usage`]).
const CHANGES_USAGE: &[&str] = &[
    "PutObject",
    "CopyObject",
    "PostObject",
    "DeleteObject",
    "DeleteObjects",
    "CompleteMultipartUpload",
    "CreateBucket",
    "DeleteBucket",
];

/// Usage of counted buckets ([`crate::usage`]): name -> (objects, bytes), and when last counted.
#[derive(Debug, Default)]
struct Usage {
    buckets: HashMap<String, (u64, u64)>,
    counted: Option<Instant>,
}

pub static TABLE: MetricTable = MetricTable {
    daemon: "rgw",
    metrics: METRICS,
};

/// Buckets tracked by name at most; traffic of buckets past that counts in `other` at once.
pub const MAX_TRACKED_BUCKETS: usize = 10_000;

#[derive(Debug, Clone, Copy, Default)]
struct BucketTraffic {
    requests: u64,
    bytes_in: u64,
    bytes_out: u64,
}

/// The gateway's metrics.
#[derive(Debug)]
pub struct RgwMetrics {
    requests: CounterVec,
    received: CounterVec,
    sent: CounterVec,
    latency: HistogramVec,
    in_flight: Gauge,
    buckets: Mutex<(HashMap<String, BucketTraffic>, BucketTraffic)>,
    top_k: usize,
    /// Buckets changed since the last usage pass (at most [`MAX_TRACKED_BUCKETS`]; past that,
    /// the flag asks for a full pass).
    changed: Mutex<(std::collections::HashSet<String>, bool)>,
    usage: Mutex<Usage>,
}

impl RgwMetrics {
    pub fn new(top_k: usize) -> Arc<RgwMetrics> {
        Arc::new(RgwMetrics {
            requests: CounterVec::new(&METRICS[0]),
            received: CounterVec::new(&METRICS[1]),
            sent: CounterVec::new(&METRICS[2]),
            latency: HistogramVec::new(&METRICS[3], LATENCY_BUCKETS),
            in_flight: Gauge::default(),
            buckets: Mutex::new((HashMap::new(), BucketTraffic::default())),
            top_k: top_k.max(1),
            changed: Mutex::default(),
            usage: Mutex::default(),
        })
    }

    /// Exports everything into `reg`.
    pub fn register(self: &Arc<Self>, reg: &mut Registry) {
        reg.add_counter_vec(&self.requests);
        reg.add_counter_vec(&self.received);
        reg.add_counter_vec(&self.sent);
        reg.add_histogram_vec(&self.latency);
        reg.add_gauge(&METRICS[4], &self.in_flight);
        let me = Arc::downgrade(self);
        reg.snapshot(&METRICS[5..7], move |s| {
            if let Some(m) = me.upgrade() {
                m.bucket_snapshot(s);
            }
        });
        let me = Arc::downgrade(self);
        reg.snapshot(&METRICS[7..], move |s| {
            if let Some(m) = me.upgrade() {
                m.usage_snapshot(s);
            }
        });
    }

    /// The buckets changed since the last call, and whether more changed than were tracked
    /// (then a full pass is due).
    pub fn take_changed_buckets(&self) -> (Vec<String>, bool) {
        let mut g = self.changed.lock().unwrap_or_else(|p| p.into_inner());
        let (set, overflow) = std::mem::take(&mut *g);
        (set.into_iter().collect(), overflow)
    }

    /// Records counted usage: `counted` (name, (objects, bytes)) replaces those buckets'
    /// figures, `gone` buckets are forgotten, and a `full` pass forgets every bucket it did not
    /// count.
    pub fn set_usage(
        &self,
        counted: impl IntoIterator<Item = (String, (u64, u64))>,
        gone: &[String],
        full: bool,
    ) {
        let mut u = self.usage.lock().unwrap_or_else(|p| p.into_inner());
        if full {
            u.buckets.clear();
        }
        for g in gone {
            u.buckets.remove(g);
        }
        u.buckets.extend(counted);
        u.counted = Some(Instant::now());
    }

    fn usage_snapshot(&self, s: &mut Snapshot) {
        let (items, counted) = {
            let u = self.usage.lock().unwrap_or_else(|p| p.into_inner());
            let Some(at) = u.counted else {
                return;
            };
            (
                u.buckets
                    .iter()
                    .map(|(k, v)| (k.clone(), *v))
                    .collect::<Vec<_>>(),
                at,
            )
        };
        let (mut objects, mut bytes) = (0u64, 0u64);
        for (_, (o, b)) in &items {
            objects += o;
            bytes += b;
        }
        s.set(&METRICS[9], &[], items.len() as f64);
        s.set(&METRICS[10], &[], bytes as f64);
        s.set(&METRICS[11], &[], objects as f64);
        s.set(&METRICS[12], &[], counted.elapsed().as_secs_f64());
        let top = kelp_metrics::top_k(
            items,
            self.top_k,
            |u| u.1,
            |a, b| {
                a.0 += b.0;
                a.1 += b.1;
            },
        );
        for (bucket, (o, b)) in &top {
            s.set(&METRICS[7], &[bucket], *b as f64);
            s.set(&METRICS[8], &[bucket], *o as f64);
        }
    }

    /// A request starts; the guard counts it in flight until it is dropped.
    pub fn start(self: &Arc<Self>) -> RequestGuard {
        self.in_flight.inc();
        RequestGuard {
            m: self.clone(),
            start: Instant::now(),
        }
    }

    fn done(
        &self,
        op: &'static str,
        bucket: Option<&str>,
        status: u16,
        bytes_in: u64,
        bytes_out: u64,
        start: Instant,
    ) {
        let class = match status {
            100..=199 => "1xx",
            200..=299 => "2xx",
            300..=399 => "3xx",
            400..=499 => "4xx",
            _ => "5xx",
        };
        self.requests.with(&[op, class]).inc();
        if bytes_in > 0 {
            self.received.with(&[op]).inc_by(bytes_in);
        }
        if bytes_out > 0 {
            self.sent.with(&[op]).inc_by(bytes_out);
        }
        self.latency
            .with(&[op])
            .observe(start.elapsed().as_secs_f64());
        if let Some(b) = bucket
            && class == "2xx"
            && CHANGES_USAGE.contains(&op)
        {
            let mut g = self.changed.lock().unwrap_or_else(|p| p.into_inner());
            if g.0.len() < MAX_TRACKED_BUCKETS || g.0.contains(b) {
                g.0.insert(b.to_string());
            } else {
                g.1 = true;
            }
        }
        if let Some(b) = bucket {
            let mut g = self.buckets.lock().unwrap_or_else(|p| p.into_inner());
            let (map, overflow) = &mut *g;
            let t = if map.contains_key(b) || map.len() < MAX_TRACKED_BUCKETS {
                map.entry(b.to_string()).or_default()
            } else {
                overflow
            };
            t.requests += 1;
            t.bytes_in += bytes_in;
            t.bytes_out += bytes_out;
        }
    }

    fn bucket_snapshot(&self, s: &mut Snapshot) {
        let (items, overflow) = {
            let g = self.buckets.lock().unwrap_or_else(|p| p.into_inner());
            (
                g.0.iter().map(|(k, v)| (k.clone(), *v)).collect::<Vec<_>>(),
                g.1,
            )
        };
        let mut top = kelp_metrics::top_k(
            items,
            self.top_k,
            |t| t.bytes_in + t.bytes_out,
            |a, b| {
                a.requests += b.requests;
                a.bytes_in += b.bytes_in;
                a.bytes_out += b.bytes_out;
            },
        );
        if overflow.requests > 0 {
            match top.iter_mut().find(|(k, _)| k == "other") {
                Some((_, o)) => {
                    o.requests += overflow.requests;
                    o.bytes_in += overflow.bytes_in;
                    o.bytes_out += overflow.bytes_out;
                }
                None => top.push(("other".to_string(), overflow)),
            }
        }
        for (bucket, t) in &top {
            s.set(&METRICS[5], &[bucket], t.requests as f64);
            s.set(&METRICS[6], &[bucket, "in"], t.bytes_in as f64);
            s.set(&METRICS[6], &[bucket, "out"], t.bytes_out as f64);
        }
    }
}

/// `metrics_top_k`'s default (the central config key's, `kelp_config::keys::METRICS_TOP_K`).
pub const DEFAULT_TOP_K: usize = 10;

/// `metrics_top_k` from the monitors' central config (`global` or `rgw` section; the default
/// when unset or unreachable).
pub async fn central_top_k(rados: &kelp_client::Rados) -> usize {
    let value = tokio::time::timeout(
        std::time::Duration::from_secs(5),
        rados.config_value(&["global", "rgw"], "metrics_top_k"),
    )
    .await;
    match value {
        Ok(Ok(Some(v))) => v.parse().unwrap_or(DEFAULT_TOP_K),
        _ => DEFAULT_TOP_K,
    }
}

/// A request in flight ([`RgwMetrics::start`]).
#[derive(Debug)]
pub struct RequestGuard {
    m: Arc<RgwMetrics>,
    start: Instant,
}

impl RequestGuard {
    /// The request was answered with `status`.
    pub fn done(
        self,
        op: &'static str,
        bucket: Option<&str>,
        status: u16,
        bytes_in: u64,
        bytes_out: u64,
    ) {
        self.m
            .done(op, bucket, status, bytes_in, bytes_out, self.start);
    }
}

impl Drop for RequestGuard {
    fn drop(&mut self) {
        self.m.in_flight.dec();
    }
}

/// The S3 operation of a path-style request (`/bucket/key?subresource`), from a closed set.
pub fn s3_operation(method: &str, path: &str, query: &str, copy_source: bool) -> &'static str {
    let path = path.strip_prefix('/').unwrap_or(path);
    let (bucket, key) = path.split_once('/').unwrap_or((path, ""));
    let has = |q: &str| {
        query
            .split('&')
            .any(|p| p == q || p.starts_with(&format!("{q}=")))
    };
    if method == "OPTIONS" {
        return "Options";
    }
    if bucket.is_empty() {
        return if method == "GET" {
            "ListBuckets"
        } else {
            "Other"
        };
    }
    if key.is_empty() {
        let sub = [
            "acl",
            "cors",
            "lifecycle",
            "versioning",
            "policy",
            "tagging",
            "location",
            "uploads",
            "versions",
            "delete",
        ]
        .into_iter()
        .find(|q| has(q));
        return match (method, sub) {
            ("GET", None) if has("list-type") => "ListObjectsV2",
            ("GET", None) => "ListObjects",
            ("GET", Some("uploads")) => "ListMultipartUploads",
            ("GET", Some("versions")) => "ListObjectVersions",
            ("GET", Some("location")) => "GetBucketLocation",
            ("GET", Some(_)) => "GetBucketConfig",
            ("PUT", None) => "CreateBucket",
            ("PUT", Some(_)) => "PutBucketConfig",
            ("DELETE", None) => "DeleteBucket",
            ("DELETE", Some(_)) => "DeleteBucketConfig",
            ("HEAD", _) => "HeadBucket",
            ("POST", Some("delete")) => "DeleteObjects",
            ("POST", _) => "PostObject",
            _ => "Other",
        };
    }
    match method {
        "GET" if has("uploadId") => "ListParts",
        "GET" if has("acl") || has("tagging") => "GetObjectConfig",
        "GET" => "GetObject",
        "HEAD" => "HeadObject",
        "PUT" if has("partNumber") && copy_source => "UploadPartCopy",
        "PUT" if has("partNumber") => "UploadPart",
        "PUT" if has("acl") || has("tagging") => "PutObjectConfig",
        "PUT" if copy_source => "CopyObject",
        "PUT" => "PutObject",
        "DELETE" if has("uploadId") => "AbortMultipartUpload",
        "DELETE" if has("tagging") => "DeleteObjectConfig",
        "DELETE" => "DeleteObject",
        "POST" if has("uploads") => "CreateMultipartUpload",
        "POST" if has("uploadId") => "CompleteMultipartUpload",
        "POST" => "PostObjectOther",
        _ => "Other",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn operations_from_requests() {
        assert_eq!(s3_operation("GET", "/", "", false), "ListBuckets");
        assert_eq!(s3_operation("PUT", "/b", "", false), "CreateBucket");
        assert_eq!(
            s3_operation("GET", "/b", "list-type=2", false),
            "ListObjectsV2"
        );
        assert_eq!(s3_operation("POST", "/b", "delete", false), "DeleteObjects");
        assert_eq!(s3_operation("PUT", "/b/k", "", false), "PutObject");
        assert_eq!(s3_operation("PUT", "/b/k", "", true), "CopyObject");
        assert_eq!(
            s3_operation("PUT", "/b/k", "partNumber=1&uploadId=x", false),
            "UploadPart"
        );
        assert_eq!(
            s3_operation("POST", "/b/k", "uploads", false),
            "CreateMultipartUpload"
        );
        assert_eq!(s3_operation("GET", "/b/a/b/c", "", false), "GetObject");
    }

    #[test]
    fn changes_mark_buckets_and_usage_is_top_k_by_stored_bytes() {
        let m = RgwMetrics::new(1);
        m.start().done("PutObject", Some("big"), 200, 1000, 0);
        m.start().done("GetObject", Some("read-only"), 200, 0, 10);
        m.start().done("PutObject", Some("refused"), 403, 0, 0);
        let (mut changed, overflow) = m.take_changed_buckets();
        changed.sort();
        assert_eq!((changed, overflow), (vec!["big".to_string()], false));
        assert!(m.take_changed_buckets().0.is_empty(), "taken once");
        let mut reg = Registry::new();
        m.register(&mut reg);
        let text = reg.encode_prometheus().expect("encodes");
        assert!(
            !text.contains("kelp_rgw_bucket_stored_bytes"),
            "not counted yet: {text}"
        );
        m.set_usage(
            [
                ("big".to_string(), (2, 5000)),
                ("small".to_string(), (1, 10)),
                ("tiny".to_string(), (3, 1)),
            ],
            &[],
            true,
        );
        let text = reg.encode_prometheus().expect("encodes");
        for want in [
            "kelp_rgw_bucket_stored_bytes{bucket=\"big\"} 5000",
            "kelp_rgw_bucket_stored_bytes{bucket=\"other\"} 11",
            "kelp_rgw_bucket_objects{bucket=\"other\"} 4",
            "kelp_rgw_buckets 3",
            "kelp_rgw_stored_bytes 5011",
            "kelp_rgw_objects 6",
        ] {
            assert!(text.contains(want), "{want} in {text}");
        }
        m.set_usage([], &["big".to_string()], false);
        let text = reg.encode_prometheus().expect("encodes");
        assert!(
            !text.contains("kelp_rgw_bucket_stored_bytes{bucket=\"big\"}"),
            "{text}"
        );
        assert!(text.contains("kelp_rgw_stored_bytes 11"), "{text}");
    }

    #[test]
    fn buckets_past_top_k_add_up_in_other() {
        let m = RgwMetrics::new(1);
        m.start().done("PutObject", Some("big"), 200, 1000, 0);
        m.start().done("PutObject", Some("small"), 200, 10, 0);
        m.start().done("PutObject", Some("tiny"), 200, 1, 0);
        let mut reg = Registry::new();
        m.register(&mut reg);
        let text = reg.encode_prometheus().expect("encodes");
        assert!(
            text.contains("kelp_rgw_bucket_requests_total{bucket=\"big\"} 1"),
            "{text}"
        );
        assert!(
            text.contains("kelp_rgw_bucket_requests_total{bucket=\"other\"} 2"),
            "{text}"
        );
        assert!(!text.contains("bucket=\"small\""), "{text}");
        assert!(text.contains("kelp_rgw_requests_in_flight 0"), "{text}");
        assert!(
            text.contains("kelp_rgw_requests_total{op=\"PutObject\",status=\"2xx\"} 3"),
            "{text}"
        );
    }
}
