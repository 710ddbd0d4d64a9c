//! Metrics plumbing every Kelp daemon shares.
//!
//! - A metric is declared once, as a [`MetricDef`] (name, type, help, label names) in a
//!   `static` table of the crate that owns it (`kelp_osd::metrics::METRICS`, …). The registry
//!   only accepts handles made from those definitions, and `docs/METRICS.md` is generated from
//!   the same tables ([`doc::markdown`]), so the documentation cannot drift from the code.
//! - Live metrics ([`Counter`], [`Gauge`], [`Histogram`] and their labelled `*Vec` families)
//!   are atomics: the data path increments them and never waits for a scrape.
//! - Metrics that describe state rather than events (PGs by state, pools, health checks) are
//!   [`Registry::snapshot`] sources: a closure run when `/metrics` is requested, which reads the
//!   daemon's state under the daemon's own short locks. Encoding happens on the request's task.
//! - [`process`] adds the process's CPU, memory, file descriptors and start time from `/proc`.
//! - [`server::serve`] answers `GET /metrics` in the Prometheus text format (or OpenMetrics when
//!   the scraper asks for it).
//!
//! Cardinality budget: label values come from small closed sets (op types, states, status
//! classes) or are capped by the caller to a configured top-K ([`top_k`]); no label may grow
//! with objects, buckets or clients.

use prometheus_client::encoding::{DescriptorEncoder, NoLabelSet};
use prometheus_client::metrics::MetricType as PcType;
use prometheus_client::metrics::family::Family;

pub mod doc;
pub mod process;
pub mod server;

pub use server::{MetricsServer, serve};

/// What kind of series a metric is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MetricType {
    /// Only goes up (exported with the `_total` suffix).
    Counter,
    /// Goes up and down.
    Gauge,
    /// Distribution of observations (`_bucket`, `_sum`, `_count` series).
    Histogram,
}

impl MetricType {
    pub fn as_str(self) -> &'static str {
        match self {
            MetricType::Counter => "counter",
            MetricType::Gauge => "gauge",
            MetricType::Histogram => "histogram",
        }
    }
    fn pc(self) -> PcType {
        match self {
            MetricType::Counter => PcType::Counter,
            MetricType::Gauge => PcType::Gauge,
            MetricType::Histogram => PcType::Histogram,
        }
    }
}

/// One metric, declared once. `name` is the base name: counters are exported as `name_total`.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct MetricDef {
    pub name: &'static str,
    pub kind: MetricType,
    pub help: &'static str,
    pub labels: &'static [&'static str],
}

impl MetricDef {
    /// The name of the series as exported (`_total` added to counters).
    pub fn exported_name(&self) -> String {
        match self.kind {
            MetricType::Counter => format!("{}_total", self.name),
            _ => self.name.to_string(),
        }
    }
}

/// A table of metric definitions for one daemon kind (or for every daemon: `"all"`), for docs.
#[derive(Debug, Clone, Copy)]
pub struct MetricTable {
    /// Which daemons export it: `all`, `mon`, `osd`, `rgw`, `nbd`, … (several: `mon,osd`)
    pub daemon: &'static str,
    pub metrics: &'static [MetricDef],
}

/// Why the metrics endpoint could not start.
#[derive(Debug, thiserror::Error)]
pub enum MetricsError {
    #[error("binding the metrics endpoint to {addr}: {source}")]
    Bind {
        addr: std::net::SocketAddr,
        #[source]
        source: std::io::Error,
    },
    #[error("encoding metrics: {0}")]
    Encode(#[from] std::fmt::Error),
}

/// The help text as the encoder wants it: it adds the closing period itself.
fn help(def: &MetricDef) -> &'static str {
    def.help.trim_end_matches('.')
}

/// Label set of a series: (label name, value) in the order of its [`MetricDef::labels`].
pub type Labels = Vec<(&'static str, String)>;

fn labels_of(def: &MetricDef, values: &[&str]) -> Labels {
    debug_assert_eq!(
        def.labels.len(),
        values.len(),
        "{} takes labels {:?}",
        def.name,
        def.labels
    );
    def.labels
        .iter()
        .zip(values)
        .map(|(k, v)| (*k, (*v).to_string()))
        .collect()
}

/// A monotonically increasing count (an atomic; clones share the value).
pub type Counter = prometheus_client::metrics::counter::Counter;
/// An integer gauge (an atomic; clones share the value).
pub type Gauge = prometheus_client::metrics::gauge::Gauge;
/// A histogram (clones share the buckets).
pub type Histogram = prometheus_client::metrics::histogram::Histogram;

/// Latency buckets in seconds, 100 µs to ~13 s, for operation latencies.
pub const LATENCY_BUCKETS: &[f64] = &[
    0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5,
    5.0, 10.0,
];

/// A family of counters with labels; [`CounterVec::with`] returns the counter of one label set
/// (keep it: incrementing it is then one atomic add).
#[derive(Clone, Debug)]
pub struct CounterVec {
    def: &'static MetricDef,
    family: Family<Labels, Counter>,
}

impl CounterVec {
    /// A family not yet in a registry (add it with [`Registry::add_counter_vec`]).
    pub fn new(def: &'static MetricDef) -> Self {
        debug_assert_eq!(def.kind, MetricType::Counter, "{}", def.name);
        CounterVec {
            def,
            family: Family::default(),
        }
    }
    pub fn with(&self, values: &[&str]) -> Counter {
        self.family
            .get_or_create_owned(&labels_of(self.def, values))
    }
}

/// A family of gauges with labels.
#[derive(Clone, Debug)]
pub struct GaugeVec {
    def: &'static MetricDef,
    family: Family<Labels, Gauge>,
}

impl GaugeVec {
    /// A family not yet in a registry (add it with [`Registry::add_gauge_vec`]).
    pub fn new(def: &'static MetricDef) -> Self {
        debug_assert_eq!(def.kind, MetricType::Gauge, "{}", def.name);
        GaugeVec {
            def,
            family: Family::default(),
        }
    }
    pub fn with(&self, values: &[&str]) -> Gauge {
        self.family
            .get_or_create_owned(&labels_of(self.def, values))
    }
    /// Drops every series (before refilling a top-K set).
    pub fn clear(&self) {
        self.family.clear()
    }
}

/// Makes the histograms of a [`HistogramVec`] with its buckets.
#[derive(Clone, Debug)]
pub struct HistogramMaker(&'static [f64]);

impl prometheus_client::metrics::family::MetricConstructor<Histogram> for HistogramMaker {
    fn new_metric(&self) -> Histogram {
        Histogram::new(self.0.iter().copied())
    }
}

/// A family of histograms with labels, all with the same buckets.
#[derive(Clone)]
pub struct HistogramVec {
    def: &'static MetricDef,
    family: Family<Labels, Histogram, HistogramMaker>,
}

impl std::fmt::Debug for HistogramVec {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("HistogramVec")
            .field("name", &self.def.name)
            .finish()
    }
}

impl HistogramVec {
    /// A family not yet in a registry (add it with [`Registry::add_histogram_vec`]).
    pub fn new(def: &'static MetricDef, buckets: &'static [f64]) -> Self {
        debug_assert_eq!(def.kind, MetricType::Histogram, "{}", def.name);
        HistogramVec {
            def,
            family: Family::new_with_constructor(HistogramMaker(buckets)),
        }
    }
    pub fn with(&self, values: &[&str]) -> Histogram {
        self.family
            .get_or_create_owned(&labels_of(self.def, values))
    }
}

/// Values of snapshot metrics, filled by a [`Registry::snapshot`] source at each scrape.
#[derive(Debug, Default)]
pub struct Snapshot {
    samples: Vec<(&'static MetricDef, Labels, f64)>,
}

impl Snapshot {
    /// Sets one series of `def` (a gauge or counter of the source's table).
    pub fn set(&mut self, def: &'static MetricDef, values: &[&str], value: f64) {
        self.samples.push((def, labels_of(def, values), value));
    }
}

type SourceFn = dyn Fn(&mut Snapshot) + Send + Sync;

struct SnapshotCollector {
    defs: Vec<&'static MetricDef>,
    source: Box<SourceFn>,
}

impl std::fmt::Debug for SnapshotCollector {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SnapshotCollector")
            .field("defs", &self.defs.len())
            .finish()
    }
}

impl prometheus_client::collector::Collector for SnapshotCollector {
    fn encode(&self, mut encoder: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        let mut snap = Snapshot::default();
        (self.source)(&mut snap);
        for def in &self.defs {
            let mut series = snap
                .samples
                .iter()
                .filter(|(d, _, _)| std::ptr::eq(*d, *def))
                .peekable();
            if series.peek().is_none() {
                continue;
            }
            let mut metric = encoder.encode_descriptor(def.name, help(def), None, def.kind.pc())?;
            for (_, labels, value) in series {
                let mut m = metric.encode_family(labels)?;
                match def.kind {
                    MetricType::Counter => {
                        m.encode_counter::<NoLabelSet, f64, f64>(value, None)?;
                    }
                    _ => m.encode_gauge(value)?,
                }
            }
        }
        Ok(())
    }
}

/// The metrics of one daemon. Built at start-up (handles registered, snapshot sources added),
/// then shared read-only (`Arc`) with the HTTP endpoint.
#[derive(Debug, Default)]
pub struct Registry {
    inner: prometheus_client::registry::Registry,
    defs: Vec<&'static MetricDef>,
}

impl Registry {
    pub fn new() -> Self {
        Self::default()
    }

    fn note(&mut self, def: &'static MetricDef, kind: MetricType) {
        debug_assert_eq!(def.kind, kind, "{} is declared as {:?}", def.name, def.kind);
        debug_assert!(
            !def.name.ends_with("_total"),
            "{}: counters are declared without _total",
            def.name
        );
        debug_assert!(
            !self.defs.iter().any(|d| d.name == def.name),
            "{} registered twice",
            def.name
        );
        self.defs.push(def);
    }

    pub fn counter(&mut self, def: &'static MetricDef) -> Counter {
        self.note(def, MetricType::Counter);
        let c = Counter::default();
        self.inner.register(def.name, help(def), c.clone());
        c
    }

    pub fn gauge(&mut self, def: &'static MetricDef) -> Gauge {
        self.note(def, MetricType::Gauge);
        let g = Gauge::default();
        self.inner.register(def.name, help(def), g.clone());
        g
    }

    pub fn counter_vec(&mut self, def: &'static MetricDef) -> CounterVec {
        let v = CounterVec::new(def);
        self.add_counter_vec(&v);
        v
    }

    pub fn gauge_vec(&mut self, def: &'static MetricDef) -> GaugeVec {
        let v = GaugeVec::new(def);
        self.add_gauge_vec(&v);
        v
    }

    pub fn histogram_vec(
        &mut self,
        def: &'static MetricDef,
        buckets: &'static [f64],
    ) -> HistogramVec {
        let v = HistogramVec::new(def, buckets);
        self.add_histogram_vec(&v);
        v
    }

    /// Exports a counter made earlier.
    pub fn add_counter(&mut self, def: &'static MetricDef, c: &Counter) {
        self.note(def, MetricType::Counter);
        self.inner.register(def.name, help(def), c.clone());
    }

    /// Exports a gauge made earlier.
    pub fn add_gauge(&mut self, def: &'static MetricDef, g: &Gauge) {
        self.note(def, MetricType::Gauge);
        self.inner.register(def.name, help(def), g.clone());
    }

    /// Exports a family made earlier (by a component built before the registry).
    pub fn add_counter_vec(&mut self, v: &CounterVec) {
        self.note(v.def, MetricType::Counter);
        self.inner
            .register(v.def.name, help(v.def), v.family.clone());
    }

    pub fn add_gauge_vec(&mut self, v: &GaugeVec) {
        self.note(v.def, MetricType::Gauge);
        self.inner
            .register(v.def.name, help(v.def), v.family.clone());
    }

    pub fn add_histogram_vec(&mut self, v: &HistogramVec) {
        self.note(v.def, MetricType::Histogram);
        self.inner
            .register(v.def.name, help(v.def), v.family.clone());
    }

    /// Adds metrics computed at each scrape by `source` (which may set any of `defs`). The
    /// source runs on the scrape's task: it must only read atomics or take short locks.
    pub fn snapshot(
        &mut self,
        defs: &'static [MetricDef],
        source: impl Fn(&mut Snapshot) + Send + Sync + 'static,
    ) {
        for def in defs {
            debug_assert!(def.kind != MetricType::Histogram, "{}", def.name);
            self.note(def, def.kind);
        }
        self.inner.register_collector(Box::new(SnapshotCollector {
            defs: defs.iter().collect(),
            source: Box::new(source),
        }));
    }

    /// Adds the common metrics of every daemon: `kelp_daemon_info` and the process's.
    pub fn register_common(&mut self, daemon: &str, kind: &str) {
        let daemon = daemon.to_string();
        let kind = kind.to_string();
        let version = env!("CARGO_PKG_VERSION");
        let start = process::start_time_seconds();
        self.snapshot(COMMON_METRICS, move |s| {
            s.set(&COMMON_METRICS[0], &[&daemon, &kind, version], 1.0);
            process::collect(s, start);
        });
    }

    /// Every metric registered so far (for tests that compare with the docs).
    pub fn defs(&self) -> &[&'static MetricDef] {
        &self.defs
    }

    /// The metrics in the Prometheus text format (version 0.0.4).
    pub fn encode_prometheus(&self) -> Result<String, MetricsError> {
        let mut out = String::with_capacity(16 * 1024);
        prometheus_client::encoding::prometheus_text::encode(&mut out, &self.inner)?;
        Ok(out)
    }

    /// The metrics in the OpenMetrics text format (ends with `# EOF`).
    pub fn encode_openmetrics(&self) -> Result<String, MetricsError> {
        let mut out = String::with_capacity(16 * 1024);
        prometheus_client::encoding::text::encode(&mut out, &self.inner)?;
        Ok(out)
    }
}

/// Metrics every daemon exports.
pub static COMMON_METRICS: &[MetricDef] = &[
    MetricDef {
        name: "kelp_daemon_info",
        kind: MetricType::Gauge,
        help: "Always 1; its labels name the daemon (e.g. osd.3), its kind and Kelp's version.",
        labels: &["daemon", "kind", "version"],
    },
    MetricDef {
        name: "process_cpu_seconds",
        kind: MetricType::Counter,
        help: "CPU time (user + system) the daemon's process has used, in seconds.",
        labels: &[],
    },
    MetricDef {
        name: "process_resident_memory_bytes",
        kind: MetricType::Gauge,
        help: "Resident memory of the daemon's process, in bytes.",
        labels: &[],
    },
    MetricDef {
        name: "process_virtual_memory_bytes",
        kind: MetricType::Gauge,
        help: "Virtual memory of the daemon's process, in bytes.",
        labels: &[],
    },
    MetricDef {
        name: "process_open_fds",
        kind: MetricType::Gauge,
        help: "Open file descriptors of the daemon's process.",
        labels: &[],
    },
    MetricDef {
        name: "process_max_fds",
        kind: MetricType::Gauge,
        help: "The process's limit on open file descriptors.",
        labels: &[],
    },
    MetricDef {
        name: "process_threads",
        kind: MetricType::Gauge,
        help: "Threads of the daemon's process.",
        labels: &[],
    },
    MetricDef {
        name: "process_start_time_seconds",
        kind: MetricType::Gauge,
        help: "When the daemon's process started, in seconds since the Unix epoch.",
        labels: &[],
    },
];

/// The table of [`COMMON_METRICS`] for docs.
pub static COMMON_TABLE: MetricTable = MetricTable {
    daemon: "all",
    metrics: COMMON_METRICS,
};

/// A messenger's counters (`kelp_msgr::MsgrStats`, copied by the daemon that owns it; this
/// crate depends on no messenger). A daemon with several messengers reports their sum.
#[derive(Debug, Clone, Default)]
pub struct MsgrCounts {
    pub peers: u64,
    pub connections_accepted: u64,
    pub connections_dialed: u64,
    pub handshake_failures: u64,
    pub auth_failures: u64,
    pub frame_errors: u64,
    pub frames_sent: u64,
    pub flushes: u64,
    /// Dials that failed.
    pub connect_failures: u64,
    /// Traffic and connections by kind of peer (a closed set: `kelp_msgr::PEER_TYPES`).
    pub by_peer: Vec<MsgrPeerCounts>,
}

/// A messenger's counters for one kind of peer (`kelp_msgr::PeerStats`).
#[derive(Debug, Clone, Copy, Default)]
pub struct MsgrPeerCounts {
    /// The kind of peer: `mon`, `osd`, `mds`, `mgr`, `client` or `other`.
    pub peer: &'static str,
    pub bytes_sent: u64,
    pub bytes_received: u64,
    pub messages_sent: u64,
    pub messages_received: u64,
    pub connections_open: u64,
    pub connections_closed: u64,
    pub connection_errors: u64,
    pub reconnects: u64,
}

/// Messenger metrics of every daemon that speaks the cluster protocol (kelp-msgr): its own
/// listening messenger, if any, and those it dials the monitors and OSDs with.
pub static MSGR_METRICS: &[MetricDef] = &[
    MetricDef {
        name: "kelp_msgr_peers",
        kind: MetricType::Gauge,
        help: "Open messenger connections (sessions with peers).",
        labels: &[],
    },
    MetricDef {
        name: "kelp_msgr_connections",
        kind: MetricType::Counter,
        help: "Messenger connections that completed the handshake, by direction.",
        labels: &["direction"],
    },
    MetricDef {
        name: "kelp_msgr_handshake_failures",
        kind: MetricType::Counter,
        help: "Messenger handshakes that failed, by reason (auth or other).",
        labels: &["reason"],
    },
    MetricDef {
        name: "kelp_msgr_frame_errors",
        kind: MetricType::Counter,
        help: "Messenger connections closed because of a malformed frame.",
        labels: &[],
    },
    MetricDef {
        name: "kelp_msgr_frames_sent",
        kind: MetricType::Counter,
        help: "Frames written to messenger sockets (keepalives included).",
        labels: &[],
    },
    MetricDef {
        name: "kelp_msgr_flushes",
        kind: MetricType::Counter,
        help: "Messenger socket flushes (each carries one or more frames).",
        labels: &[],
    },
    // messenger statistics by kind of peer: 6..
    MetricDef {
        name: "kelp_msgr_sent_bytes",
        kind: MetricType::Counter,
        help: "Bytes written to messenger sockets (frame headers included), by kind of peer (mon, osd, mds, mgr, client, other).",
        labels: &["peer"],
    },
    MetricDef {
        name: "kelp_msgr_received_bytes",
        kind: MetricType::Counter,
        help: "Bytes read from messenger sockets (frame headers included), by kind of peer.",
        labels: &["peer"],
    },
    MetricDef {
        name: "kelp_msgr_sent_messages",
        kind: MetricType::Counter,
        help: "Requests, replies and one-way messages sent (keepalives not counted), by kind of peer.",
        labels: &["peer"],
    },
    MetricDef {
        name: "kelp_msgr_received_messages",
        kind: MetricType::Counter,
        help: "Requests, replies and one-way messages received (keepalives not counted), by kind of peer.",
        labels: &["peer"],
    },
    MetricDef {
        name: "kelp_msgr_connections_open",
        kind: MetricType::Gauge,
        help: "Messenger connections open now, by kind of peer.",
        labels: &["peer"],
    },
    MetricDef {
        name: "kelp_msgr_connections_closed",
        kind: MetricType::Counter,
        help: "Messenger connections closed for any reason, by kind of peer.",
        labels: &["peer"],
    },
    MetricDef {
        name: "kelp_msgr_connection_errors",
        kind: MetricType::Counter,
        help: "Messenger connections closed by a fault (failed write, malformed frame, keepalive timeout), by kind of peer.",
        labels: &["peer"],
    },
    MetricDef {
        name: "kelp_msgr_reconnects",
        kind: MetricType::Counter,
        help: "Connections dialled again after the previous one to the same address was lost, by kind of peer.",
        labels: &["peer"],
    },
    MetricDef {
        name: "kelp_msgr_connect_failures",
        kind: MetricType::Counter,
        help: "Dials that failed (no answer, refused, handshake failed), before any retry.",
        labels: &[],
    },
];

/// The messenger table for docs.
pub static MSGR_TABLE: MetricTable = MetricTable {
    daemon: "mon,osd,mds,rgw,nbd,mgr",
    metrics: MSGR_METRICS,
};

impl Registry {
    /// Adds [`MSGR_METRICS`], read from `counts` at each scrape.
    pub fn register_msgr(&mut self, counts: impl Fn() -> MsgrCounts + Send + Sync + 'static) {
        self.snapshot(MSGR_METRICS, move |s| {
            let c = counts();
            let m = MSGR_METRICS;
            s.set(&m[0], &[], c.peers as f64);
            s.set(&m[1], &["in"], c.connections_accepted as f64);
            s.set(&m[1], &["out"], c.connections_dialed as f64);
            s.set(&m[2], &["auth"], c.auth_failures as f64);
            s.set(&m[2], &["other"], c.handshake_failures as f64);
            s.set(&m[3], &[], c.frame_errors as f64);
            s.set(&m[4], &[], c.frames_sent as f64);
            s.set(&m[5], &[], c.flushes as f64);
            for p in &c.by_peer {
                let l = &[p.peer];
                s.set(&m[6], l, p.bytes_sent as f64);
                s.set(&m[7], l, p.bytes_received as f64);
                s.set(&m[8], l, p.messages_sent as f64);
                s.set(&m[9], l, p.messages_received as f64);
                s.set(&m[10], l, p.connections_open as f64);
                s.set(&m[11], l, p.connections_closed as f64);
                s.set(&m[12], l, p.connection_errors as f64);
                s.set(&m[13], l, p.reconnects as f64);
            }
            s.set(&m[14], &[], c.connect_failures as f64);
        });
    }
}

/// The `k` largest of `items` by `key` (ties by name), for top-K labels: everything past `k`
/// is summed into one `"other"` entry so totals still add up.
pub fn top_k<T: Clone>(
    mut items: Vec<(String, T)>,
    k: usize,
    key: impl Fn(&T) -> u64,
    merge: impl Fn(&mut T, &T),
) -> Vec<(String, T)> {
    items.sort_by(|a, b| key(&b.1).cmp(&key(&a.1)).then_with(|| a.0.cmp(&b.0)));
    if items.len() <= k {
        return items;
    }
    let rest = items.split_off(k);
    let mut other = rest[0].1.clone();
    for (_, v) in &rest[1..] {
        merge(&mut other, v);
    }
    items.push(("other".to_string(), other));
    items
}

#[cfg(test)]
mod tests;
