//! The NBD server's Prometheus metrics (`/metrics`, see `kelp_metrics`): requests, bytes and
//! latency by NBD command, and connections. The request path only touches handles made at
//! start-up (atomic adds, one histogram observation); no label grows with clients or exports.

use std::sync::Arc;
use std::time::Instant;

use kelp_metrics::{
    Counter, CounterVec, Gauge, Histogram, HistogramVec, LATENCY_BUCKETS, MetricDef, MetricTable,
    MetricType as T, Registry,
};

use crate::validate::Command;

pub static METRICS: &[MetricDef] = &[
    MetricDef {
        name: "kelp_nbd_requests",
        kind: T::Counter,
        help: "NBD requests answered, by command.",
        labels: &["command"],
    },
    MetricDef {
        name: "kelp_nbd_bytes",
        kind: T::Counter,
        help: "Data bytes read or written by clients, by command (read, write).",
        labels: &["command"],
    },
    MetricDef {
        name: "kelp_nbd_request_latency_seconds",
        kind: T::Histogram,
        help: "Time from a request's arrival to its reply being queued, by command.",
        labels: &["command"],
    },
    MetricDef {
        name: "kelp_nbd_connections",
        kind: T::Counter,
        help: "Client connections accepted.",
        labels: &[],
    },
    MetricDef {
        name: "kelp_nbd_connections_open",
        kind: T::Gauge,
        help: "Client connections open now.",
        labels: &[],
    },
];

pub static TABLE: MetricTable = MetricTable {
    daemon: "nbd",
    metrics: METRICS,
};

/// NBD commands, as labelled.
pub const COMMANDS: &[&str] = &[
    "read",
    "write",
    "flush",
    "trim",
    "write_zeroes",
    "block_status",
    "cache",
];

fn command_index(cmd: &Command) -> usize {
    match cmd {
        Command::Read { .. } => 0,
        Command::Write { .. } => 1,
        Command::Flush => 2,
        Command::Trim { .. } => 3,
        Command::WriteZeroes { .. } => 4,
        Command::BlockStatus { .. } => 5,
        _ => 6,
    }
}

#[derive(Debug)]
struct PerCommand {
    requests: Counter,
    bytes: Counter,
    latency: Histogram,
}

/// The server's metrics (one per [`NbdServer`](crate::NbdServer)).
#[derive(Debug)]
pub struct NbdMetrics {
    requests: CounterVec,
    bytes: CounterVec,
    latency: HistogramVec,
    connections: Counter,
    open: Gauge,
    per: Vec<PerCommand>,
}

impl Default for NbdMetrics {
    fn default() -> Self {
        let requests = CounterVec::new(&METRICS[0]);
        let bytes = CounterVec::new(&METRICS[1]);
        let latency = HistogramVec::new(&METRICS[2], LATENCY_BUCKETS);
        let per = COMMANDS
            .iter()
            .map(|c| PerCommand {
                requests: requests.with(&[c]),
                bytes: bytes.with(&[c]),
                latency: latency.with(&[c]),
            })
            .collect();
        NbdMetrics {
            requests,
            bytes,
            latency,
            connections: Counter::default(),
            open: Gauge::default(),
            per,
        }
    }
}

/// Times one request.
#[derive(Debug)]
pub(crate) struct RequestTimer {
    m: Arc<NbdMetrics>,
    command: usize,
    bytes: u64,
    start: Instant,
}

impl RequestTimer {
    pub(crate) fn done(self) {
        let p = &self.m.per[self.command];
        p.requests.inc();
        p.bytes.inc_by(self.bytes);
        p.latency.observe(self.start.elapsed().as_secs_f64());
    }
}

/// Counts an open connection until dropped.
#[derive(Debug)]
pub(crate) struct ConnectionGuard(Arc<NbdMetrics>);

impl Drop for ConnectionGuard {
    fn drop(&mut self) {
        self.0.open.dec();
    }
}

impl NbdMetrics {
    /// Exports everything into `reg`.
    pub fn register(&self, reg: &mut Registry) {
        reg.add_counter_vec(&self.requests);
        reg.add_counter_vec(&self.bytes);
        reg.add_histogram_vec(&self.latency);
        reg.add_counter(&METRICS[3], &self.connections);
        reg.add_gauge(&METRICS[4], &self.open);
    }

    pub(crate) fn request(self: &Arc<Self>, cmd: &Command) -> RequestTimer {
        let bytes = match cmd {
            Command::Read { len, .. } | Command::Write { len, .. } => u64::from(*len),
            _ => 0,
        };
        RequestTimer {
            m: self.clone(),
            command: command_index(cmd),
            bytes,
            start: Instant::now(),
        }
    }

    pub(crate) fn connection(self: &Arc<Self>) -> ConnectionGuard {
        self.connections.inc();
        self.open.inc();
        ConnectionGuard(self.clone())
    }
}
