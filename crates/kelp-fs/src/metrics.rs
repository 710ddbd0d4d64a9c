//! The metadata server's Prometheus metrics (`/metrics`, see `kelp_metrics`).
//!
//! Hot path: every client request goes through [`MdsMetrics::start`]/[`RequestTimer::finish`]:
//! handles made at start-up, one per operation (a closed set, [`OPS`]), so counting is a few
//! atomic adds and one histogram observation. The journal, checkpoints and capabilities count
//! into plain counters where they happen; what describes state (sessions, inodes with
//! capabilities) is read at scrape time under the capability table's short lock.

use std::time::Instant;

use kelp_metrics::{
    Counter, CounterVec, Gauge, Histogram, HistogramVec, LATENCY_BUCKETS, MetricDef, MetricTable,
    MetricType as T, Registry, Snapshot,
};

use crate::types::Op;

/// The operations requests are counted by. A closed set: no label grows with use.
pub const OPS: &[&str] = &[
    "lookup",
    "getattr",
    "setattr",
    "mknod",
    "mkdir",
    "symlink",
    "link",
    "unlink",
    "rmdir",
    "rename",
    "readdir",
    "setxattr",
    "getxattr",
    "listxattr",
    "removexattr",
    "written",
    "open",
    "close",
    "reconnect",
    "getlk",
    "setlk",
    "release_locks",
    "cap_poll",
    "written_inline",
    "read_inline",
    "uninline",
    "other",
];

/// Index into [`OPS`] of a request's operation.
pub fn op_index(op: &Op) -> usize {
    let name = match op {
        Op::Lookup { .. } => "lookup",
        Op::GetAttr { .. } => "getattr",
        Op::SetAttr { .. } => "setattr",
        Op::Mknod { .. } => "mknod",
        Op::Mkdir { .. } => "mkdir",
        Op::Symlink { .. } => "symlink",
        Op::Link { .. } => "link",
        Op::Unlink { .. } => "unlink",
        Op::Rmdir { .. } => "rmdir",
        Op::Rename { .. } => "rename",
        Op::ReadDir { .. } => "readdir",
        Op::SetXattr { .. } => "setxattr",
        Op::GetXattr { .. } => "getxattr",
        Op::ListXattr { .. } => "listxattr",
        Op::RemoveXattr { .. } => "removexattr",
        Op::Written { .. } => "written",
        Op::Open { .. } => "open",
        Op::Close { .. } => "close",
        Op::Reconnect { .. } => "reconnect",
        Op::GetLk { .. } => "getlk",
        Op::SetLk { .. } => "setlk",
        Op::ReleaseLocks { .. } => "release_locks",
        Op::CapPoll { .. } => "cap_poll",
        Op::CloseMany { .. } => "close",
        Op::WrittenInline { .. } => "written_inline",
        Op::ReadInline { .. } => "read_inline",
        Op::Uninline { .. } => "uninline",
        #[allow(unreachable_patterns)]
        _ => "other",
    };
    OPS.iter().position(|o| *o == name).unwrap_or(OPS.len() - 1)
}

/// Every metric an MDS exports (besides the common and messenger ones).
pub static METRICS: &[MetricDef] = &[
    // live: 0..=11
    MetricDef {
        name: "kelp_mds_requests",
        kind: T::Counter,
        help: "Client requests answered, by operation (cap_poll: the clients' capability long-polls).",
        labels: &["op"],
    },
    MetricDef {
        name: "kelp_mds_request_errors",
        kind: T::Counter,
        help: "Client requests answered with an error (an errno), by operation.",
        labels: &["op"],
    },
    MetricDef {
        name: "kelp_mds_request_latency_seconds",
        kind: T::Histogram,
        help: "Time from a request's arrival to its reply, by operation (capability long-polls not timed).",
        labels: &["op"],
    },
    MetricDef {
        name: "kelp_mds_requests_in_flight",
        kind: T::Gauge,
        help: "Client requests being served now (capability long-polls included).",
        labels: &[],
    },
    MetricDef {
        name: "kelp_mds_journal_appends",
        kind: T::Counter,
        help: "Entries appended to the metadata journal.",
        labels: &[],
    },
    MetricDef {
        name: "kelp_mds_journal_bytes",
        kind: T::Counter,
        help: "Bytes appended to the metadata journal (as stored: batches packed).",
        labels: &[],
    },
    MetricDef {
        name: "kelp_mds_journal_segments",
        kind: T::Counter,
        help: "Journal segments closed (full, or closed by a checkpoint).",
        labels: &[],
    },
    MetricDef {
        name: "kelp_mds_journal_segments_open",
        kind: T::Gauge,
        help: "Journal segments not yet checkpointed (what a restart replays).",
        labels: &[],
    },
    MetricDef {
        name: "kelp_mds_checkpoints",
        kind: T::Counter,
        help: "Checkpoints that wrote dirty metadata back and trimmed the journal.",
        labels: &[],
    },
    MetricDef {
        name: "kelp_mds_checkpoint_failures",
        kind: T::Counter,
        help: "Checkpoints that failed (retried at the next interval).",
        labels: &[],
    },
    MetricDef {
        name: "kelp_mds_caps_granted",
        kind: T::Counter,
        help: "Capabilities granted to clients with replies (one per inode).",
        labels: &[],
    },
    MetricDef {
        name: "kelp_mds_caps_revoked",
        kind: T::Counter,
        help: "Capability revokes sent to clients, by reason (change: another client changed the inode; budget: the cache budget).",
        labels: &["reason"],
    },
    MetricDef {
        name: "kelp_mds_cached_inodes",
        kind: T::Gauge,
        help: "Inodes in the MDS's cache.",
        labels: &[],
    },
    // snapshot: 13..
    MetricDef {
        name: "kelp_mds_cache_budget_inodes",
        kind: T::Gauge,
        help: "The MDS's cache budget in inodes (--cache-inodes).",
        labels: &[],
    },
    MetricDef {
        name: "kelp_mds_sessions",
        kind: T::Gauge,
        help: "Client sessions: clients that keep a capability poll open.",
        labels: &[],
    },
    MetricDef {
        name: "kelp_mds_cap_inodes",
        kind: T::Gauge,
        help: "Inodes on which some client holds a capability.",
        labels: &[],
    },
    MetricDef {
        name: "kelp_mds_active",
        kind: T::Gauge,
        help: "1 while this MDS serves a file system (0: standby or not yet replayed).",
        labels: &[],
    },
];

/// The MDS's docs table.
pub static TABLE: MetricTable = MetricTable {
    daemon: "mds",
    metrics: METRICS,
};

/// The part of [`METRICS`] read at scrape time.
pub fn snapshot_metrics() -> &'static [MetricDef] {
    &METRICS[13..]
}

/// State the scrape reads from the daemon ([`MdsMetrics::register`]'s source).
#[derive(Debug, Clone, Copy, Default)]
pub struct MdsState {
    pub active: bool,
    pub cache_budget: usize,
    pub sessions: usize,
    pub cap_inodes: usize,
}

#[derive(Debug)]
struct PerOp {
    requests: Counter,
    errors: Counter,
    latency: Histogram,
}

/// The MDS's live metrics: made when the daemon starts, shared by its tasks.
#[derive(Debug)]
pub struct MdsMetrics {
    requests: CounterVec,
    errors: CounterVec,
    latency: HistogramVec,
    per_op: Vec<PerOp>,
    in_flight: Gauge,
    pub(crate) journal_appends: Counter,
    pub(crate) journal_bytes: Counter,
    pub(crate) journal_segments: Counter,
    pub(crate) journal_segments_open: Gauge,
    pub(crate) checkpoints: Counter,
    pub(crate) checkpoint_failures: Counter,
    pub(crate) caps_granted: Counter,
    caps_revoked: CounterVec,
    pub(crate) revoked_change: Counter,
    pub(crate) revoked_budget: Counter,
    pub(crate) cached_inodes: Gauge,
}

impl Default for MdsMetrics {
    fn default() -> Self {
        let requests = CounterVec::new(&METRICS[0]);
        let errors = CounterVec::new(&METRICS[1]);
        let latency = HistogramVec::new(&METRICS[2], LATENCY_BUCKETS);
        let per_op = OPS
            .iter()
            .map(|o| PerOp {
                requests: requests.with(&[o]),
                errors: errors.with(&[o]),
                latency: latency.with(&[o]),
            })
            .collect();
        let caps_revoked = CounterVec::new(&METRICS[11]);
        MdsMetrics {
            revoked_change: caps_revoked.with(&["change"]),
            revoked_budget: caps_revoked.with(&["budget"]),
            requests,
            errors,
            latency,
            per_op,
            in_flight: Gauge::default(),
            journal_appends: Counter::default(),
            journal_bytes: Counter::default(),
            journal_segments: Counter::default(),
            journal_segments_open: Gauge::default(),
            checkpoints: Counter::default(),
            checkpoint_failures: Counter::default(),
            caps_granted: Counter::default(),
            caps_revoked,
            cached_inodes: Gauge::default(),
        }
    }
}

/// Times one request ([`MdsMetrics::start`]); dropping it unfinished counts nothing but the
/// in-flight gauge.
#[derive(Debug)]
pub struct RequestTimer<'a> {
    m: &'a MdsMetrics,
    op: usize,
    start: Instant,
}

impl RequestTimer<'_> {
    /// The request was answered (`ok`: not with an errno).
    pub fn finish(self, ok: bool) {
        let p = &self.m.per_op[self.op];
        p.requests.inc();
        if !ok {
            p.errors.inc();
        }
        if OPS[self.op] != "cap_poll" {
            p.latency.observe(self.start.elapsed().as_secs_f64());
        }
    }
}

impl Drop for RequestTimer<'_> {
    fn drop(&mut self) {
        self.m.in_flight.dec();
    }
}

impl MdsMetrics {
    /// A request for `op` arrives.
    pub fn start(&self, op: &Op) -> RequestTimer<'_> {
        self.in_flight.inc();
        RequestTimer {
            m: self,
            op: op_index(op),
            start: Instant::now(),
        }
    }

    /// Requests answered so far, by operation (what `kelp.mds.stats` shows as `ops`).
    pub fn op_counts(&self) -> std::collections::BTreeMap<String, u64> {
        OPS.iter()
            .zip(&self.per_op)
            .map(|(o, p)| (o.to_string(), p.requests.get()))
            .filter(|(_, n)| *n > 0)
            .collect()
    }

    /// Exports everything into `reg`; `state` is read at each scrape (it must only take short
    /// locks).
    pub fn register(
        &self,
        reg: &mut Registry,
        state: impl Fn() -> MdsState + Send + Sync + 'static,
    ) {
        let m = METRICS;
        reg.add_counter_vec(&self.requests);
        reg.add_counter_vec(&self.errors);
        reg.add_histogram_vec(&self.latency);
        reg.add_gauge(&m[3], &self.in_flight);
        reg.add_counter(&m[4], &self.journal_appends);
        reg.add_counter(&m[5], &self.journal_bytes);
        reg.add_counter(&m[6], &self.journal_segments);
        reg.add_gauge(&m[7], &self.journal_segments_open);
        reg.add_counter(&m[8], &self.checkpoints);
        reg.add_counter(&m[9], &self.checkpoint_failures);
        reg.add_counter(&m[10], &self.caps_granted);
        reg.add_counter_vec(&self.caps_revoked);
        reg.add_gauge(&m[12], &self.cached_inodes);
        reg.snapshot(snapshot_metrics(), move |s: &mut Snapshot| {
            let st = state();
            s.set(&METRICS[13], &[], st.cache_budget as f64);
            s.set(&METRICS[14], &[], st.sessions as f64);
            s.set(&METRICS[15], &[], st.cap_inodes as f64);
            s.set(&METRICS[16], &[], if st.active { 1.0 } else { 0.0 });
        });
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn requests_are_counted_by_operation() {
        let m = MdsMetrics::default();
        let mut reg = Registry::new();
        m.register(&mut reg, || MdsState {
            active: true,
            cache_budget: 100,
            sessions: 2,
            cap_inodes: 3,
        });
        m.start(&Op::GetAttr { ino: 1 }).finish(true);
        m.start(&Op::GetAttr { ino: 1 }).finish(false);
        m.start(&Op::CapPoll { ack: vec![] }).finish(true);
        m.revoked_change.inc_by(2);
        let text = reg.encode_prometheus().unwrap();
        for want in [
            "kelp_mds_requests_total{op=\"getattr\"} 2",
            "kelp_mds_request_errors_total{op=\"getattr\"} 1",
            "kelp_mds_request_latency_seconds_count{op=\"getattr\"} 2",
            "kelp_mds_request_latency_seconds_count{op=\"cap_poll\"} 0",
            "kelp_mds_requests_total{op=\"cap_poll\"} 1",
            "kelp_mds_requests_in_flight 0",
            "kelp_mds_caps_revoked_total{reason=\"change\"} 2",
            "kelp_mds_sessions 2",
            "kelp_mds_active 1",
        ] {
            assert!(text.contains(want), "{want} in {text}");
        }
    }

    #[test]
    fn table_indices_match_names() {
        assert_eq!(METRICS[11].name, "kelp_mds_caps_revoked");
        assert_eq!(METRICS[12].name, "kelp_mds_cached_inodes");
        assert_eq!(METRICS[13].name, "kelp_mds_cache_budget_inodes");
        assert_eq!(METRICS.len(), 17);
    }
}
