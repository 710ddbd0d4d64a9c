//! The OSD's Prometheus metrics (`/metrics`, see `kelp_metrics`).
//!
//! Hot path: [`OsdMetrics::op_started`]/[`OpTimer`] run on every client op; they touch only
//! handles made at start-up (one per op type, no allocation, no lock): atomic adds and one
//! histogram observation. Everything that describes state (PGs by state, objects, store space,
//! scrub errors) is read at scrape time from the last stats report the OSD built for the
//! monitors (kept in [`OsdMetrics::note_report`]), so a scrape costs one short lock and a pass
//! over this OSD's primary PGs, and never waits on a PG lock. Per-PG series are not exported.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::Instant;

use kelp_metrics::{
    Counter, Gauge, Histogram, LATENCY_BUCKETS, MetricDef, MetricTable, MetricType as T, Registry,
    Snapshot,
};
use kelp_proto::{IoCounters, OpKind, OsdStatsReport, RecoveryCounters, pg_state_name};

/// The op types client ops are counted by: the first sub-op that is not a guard
/// (`AssertExists`, `CmpXattr`, …) names the op. A closed set: no label grows with use.
pub const OP_TYPES: &[&str] = &[
    "read",
    "write",
    "writefull",
    "append",
    "truncate",
    "zero",
    "create",
    "remove",
    "stat",
    "xattr_read",
    "xattr_write",
    "omap_read",
    "omap_write",
    "other",
];

/// Index into [`OP_TYPES`] of a compound op.
pub fn op_type(ops: &[OpKind]) -> usize {
    for o in ops {
        let name = match o {
            OpKind::AssertExists
            | OpKind::AssertVersion { .. }
            | OpKind::CmpXattr { .. }
            | OpKind::CmpOmap { .. } => continue,
            OpKind::Read { .. } => "read",
            OpKind::Write { .. } => "write",
            OpKind::WriteFull { .. } => "writefull",
            OpKind::Append { .. } => "append",
            OpKind::Truncate { .. } => "truncate",
            OpKind::Zero { .. } => "zero",
            OpKind::Create { .. } => "create",
            OpKind::Remove => "remove",
            OpKind::Stat => "stat",
            OpKind::GetXattr { .. } | OpKind::GetXattrs => "xattr_read",
            OpKind::SetXattr { .. } | OpKind::RmXattr { .. } => "xattr_write",
            OpKind::OmapGetVals { .. }
            | OpKind::OmapGetValsByKeys { .. }
            | OpKind::OmapGetHeader => "omap_read",
            OpKind::OmapSet { .. }
            | OpKind::OmapRm { .. }
            | OpKind::OmapClear
            | OpKind::OmapSetHeader { .. } => "omap_write",
            _ => "other",
        };
        return OP_TYPES
            .iter()
            .position(|t| *t == name)
            .unwrap_or(OP_TYPES.len() - 1);
    }
    OP_TYPES.len() - 1
}

/// Every metric an OSD exports (besides `kelp_metrics::COMMON_METRICS`).
pub static METRICS: &[MetricDef] = &[
    // live: 0..=5
    MetricDef {
        name: "kelp_osd_ops",
        kind: T::Counter,
        help: "Client ops served by this OSD as primary, by op type (successful or not).",
        labels: &["op"],
    },
    MetricDef {
        name: "kelp_osd_op_errors",
        kind: T::Counter,
        help: "Client ops that ended with an error, by op type.",
        labels: &["op"],
    },
    MetricDef {
        name: "kelp_osd_op_in_bytes",
        kind: T::Counter,
        help: "Data bytes received with client ops, by op type.",
        labels: &["op"],
    },
    MetricDef {
        name: "kelp_osd_op_out_bytes",
        kind: T::Counter,
        help: "Data bytes sent in replies to client ops, by op type.",
        labels: &["op"],
    },
    MetricDef {
        name: "kelp_osd_op_latency_seconds",
        kind: T::Histogram,
        help: "Time from receiving a client op to its reply, by op type.",
        labels: &["op"],
    },
    MetricDef {
        name: "kelp_osd_ops_in_flight",
        kind: T::Gauge,
        help: "Client ops being served now (the OSD's op queue depth).",
        labels: &[],
    },
    // snapshot: 6..
    MetricDef {
        name: "kelp_osd_client_read_ops",
        kind: T::Counter,
        help: "Successful client reads served as primary.",
        labels: &[],
    },
    MetricDef {
        name: "kelp_osd_client_read_bytes",
        kind: T::Counter,
        help: "Bytes of successful client reads served as primary.",
        labels: &[],
    },
    MetricDef {
        name: "kelp_osd_client_write_ops",
        kind: T::Counter,
        help: "Successful client writes applied as primary.",
        labels: &[],
    },
    MetricDef {
        name: "kelp_osd_client_write_bytes",
        kind: T::Counter,
        help: "Bytes of successful client writes applied as primary.",
        labels: &[],
    },
    MetricDef {
        name: "kelp_osd_recovered_objects",
        kind: T::Counter,
        help: "Objects recovered or backfilled onto this OSD.",
        labels: &[],
    },
    MetricDef {
        name: "kelp_osd_recovered_bytes",
        kind: T::Counter,
        help: "Data bytes of objects recovered or backfilled onto this OSD.",
        labels: &[],
    },
    MetricDef {
        name: "kelp_osd_pgs",
        kind: T::Gauge,
        help: "PGs this OSD is the acting primary of, by state (as `kelp pg ls` prints it).",
        labels: &["state"],
    },
    MetricDef {
        name: "kelp_osd_pg_objects",
        kind: T::Gauge,
        help: "Objects in the PGs this OSD is primary of.",
        labels: &[],
    },
    MetricDef {
        name: "kelp_osd_pg_bytes",
        kind: T::Gauge,
        help: "Object data bytes in the PGs this OSD is primary of.",
        labels: &[],
    },
    MetricDef {
        name: "kelp_osd_objects_degraded",
        kind: T::Gauge,
        help: "Missing object copies in the PGs this OSD is primary of (recovery still to do).",
        labels: &[],
    },
    MetricDef {
        name: "kelp_osd_objects_misplaced",
        kind: T::Gauge,
        help: "Object copies not where CRUSH wants them, in the PGs this OSD is primary of (backfill still to do).",
        labels: &[],
    },
    MetricDef {
        name: "kelp_osd_objects_unfound",
        kind: T::Gauge,
        help: "Objects with no readable copy, in the PGs this OSD is primary of.",
        labels: &[],
    },
    MetricDef {
        name: "kelp_osd_scrub_errors",
        kind: T::Gauge,
        help: "Inconsistent objects found by the last scrubs of the PGs this OSD is primary of.",
        labels: &[],
    },
    MetricDef {
        name: "kelp_osd_pgs_inconsistent",
        kind: T::Gauge,
        help: "PGs this OSD is primary of whose last scrub found inconsistent objects.",
        labels: &[],
    },
    MetricDef {
        name: "kelp_osd_pgs_scrubbed",
        kind: T::Gauge,
        help: "PGs this OSD is primary of that have been scrubbed at least once.",
        labels: &[],
    },
    MetricDef {
        name: "kelp_osd_oldest_scrub_age_seconds",
        kind: T::Gauge,
        help: "Age of the oldest last scrub among the scrubbed PGs this OSD is primary of.",
        labels: &[],
    },
    MetricDef {
        name: "kelp_osd_store_total_bytes",
        kind: T::Gauge,
        help: "Size of this OSD's object store.",
        labels: &[],
    },
    MetricDef {
        name: "kelp_osd_store_used_bytes",
        kind: T::Gauge,
        help: "Bytes used in this OSD's object store.",
        labels: &[],
    },
    MetricDef {
        name: "kelp_osd_store_available_bytes",
        kind: T::Gauge,
        help: "Bytes still available in this OSD's object store.",
        labels: &[],
    },
    MetricDef {
        name: "kelp_osd_full_ratio",
        kind: T::Gauge,
        help: "The full ratio (mon_osd_full_ratio) past which this OSD refuses client writes.",
        labels: &[],
    },
    MetricDef {
        name: "kelp_osd_map_epoch",
        kind: T::Gauge,
        help: "The OSD map epoch this OSD has.",
        labels: &[],
    },
    MetricDef {
        name: "kelp_osd_stats_report_age_seconds",
        kind: T::Gauge,
        help: "Age of the statistics the PG and store metrics come from (the last report to the monitors).",
        labels: &[],
    },
    // store cache and allocation (kelp_store::StoreStats, read at each scrape): 28..=35
    MetricDef {
        name: "kelp_osd_store_onode_cache_hits",
        kind: T::Counter,
        help: "Object-record (onode) cache lookups of this OSD's store that found the record.",
        labels: &[],
    },
    MetricDef {
        name: "kelp_osd_store_onode_cache_misses",
        kind: T::Counter,
        help: "Object-record cache lookups that had to read the store's metadata database.",
        labels: &[],
    },
    MetricDef {
        name: "kelp_osd_store_onode_cache_entries",
        kind: T::Gauge,
        help: "Object records (and known absences) in the store's object-record cache.",
        labels: &[],
    },
    MetricDef {
        name: "kelp_osd_store_onode_cache_bytes",
        kind: T::Gauge,
        help: "Memory the store's object-record cache holds.",
        labels: &[],
    },
    MetricDef {
        name: "kelp_osd_store_onode_cache_capacity_bytes",
        kind: T::Gauge,
        help: "The store's object-record cache budget.",
        labels: &[],
    },
    MetricDef {
        name: "kelp_osd_store_free_extents",
        kind: T::Gauge,
        help: "Free extents of the store's data device (more extents for the same free space: more fragmentation).",
        labels: &[],
    },
    MetricDef {
        name: "kelp_osd_store_largest_free_extent_bytes",
        kind: T::Gauge,
        help: "The largest free extent of the store's data device (the largest write that fits in one piece).",
        labels: &[],
    },
    MetricDef {
        name: "kelp_osd_store_free_extent_bytes",
        kind: T::Gauge,
        help: "Free space in the store's free extents (written space not in use; the data file may grow beyond it).",
        labels: &[],
    },
];

/// The part of [`METRICS`] set by the scrape-time [`snapshot`].
pub fn snapshot_metrics() -> &'static [MetricDef] {
    &METRICS[6..]
}

/// The OSD's docs table.
pub static TABLE: MetricTable = MetricTable {
    daemon: "osd",
    metrics: METRICS,
};

/// Handles of one op type.
#[derive(Debug)]
struct PerOp {
    ops: Counter,
    errors: Counter,
    in_bytes: Counter,
    out_bytes: Counter,
    latency: Histogram,
}

/// The OSD's live metrics and the last report the snapshot reads.
#[derive(Debug)]
pub struct OsdMetrics {
    ops: kelp_metrics::CounterVec,
    errors: kelp_metrics::CounterVec,
    in_bytes: kelp_metrics::CounterVec,
    out_bytes: kelp_metrics::CounterVec,
    latency: kelp_metrics::HistogramVec,
    in_flight: Gauge,
    per_op: Vec<PerOp>,
    last_report: Mutex<Option<(Instant, Arc<OsdStatsReport>)>>,
}

impl Default for OsdMetrics {
    fn default() -> Self {
        let ops = kelp_metrics::CounterVec::new(&METRICS[0]);
        let errors = kelp_metrics::CounterVec::new(&METRICS[1]);
        let in_bytes = kelp_metrics::CounterVec::new(&METRICS[2]);
        let out_bytes = kelp_metrics::CounterVec::new(&METRICS[3]);
        let latency = kelp_metrics::HistogramVec::new(&METRICS[4], LATENCY_BUCKETS);
        let per_op = OP_TYPES
            .iter()
            .map(|t| PerOp {
                ops: ops.with(&[t]),
                errors: errors.with(&[t]),
                in_bytes: in_bytes.with(&[t]),
                out_bytes: out_bytes.with(&[t]),
                latency: latency.with(&[t]),
            })
            .collect();
        OsdMetrics {
            ops,
            errors,
            in_bytes,
            out_bytes,
            latency,
            in_flight: Gauge::default(),
            per_op,
            last_report: Mutex::new(None),
        }
    }
}

/// Times one client op; [`OpTimer::finish`] counts it (dropping it unfinished counts nothing
/// but the in-flight gauge).
#[derive(Debug)]
pub struct OpTimer<'a> {
    m: &'a OsdMetrics,
    op: usize,
    start: Instant,
}

impl OpTimer<'_> {
    pub fn finish(self, ok: bool, in_bytes: u64, out_bytes: u64) {
        let p = &self.m.per_op[self.op];
        p.ops.inc();
        if !ok {
            p.errors.inc();
        }
        p.in_bytes.inc_by(in_bytes);
        p.out_bytes.inc_by(out_bytes);
        p.latency.observe(self.start.elapsed().as_secs_f64());
    }
}

impl Drop for OpTimer<'_> {
    fn drop(&mut self) {
        self.m.in_flight.dec();
    }
}

impl OsdMetrics {
    /// A client op of `ops` starts.
    pub fn op_started(&self, ops: &[OpKind]) -> OpTimer<'_> {
        self.in_flight.inc();
        OpTimer {
            m: self,
            op: op_type(ops),
            start: Instant::now(),
        }
    }

    /// Keeps the report just built for the monitors, for the next scrapes.
    pub fn note_report(&self, report: &OsdStatsReport) {
        let mut last = self.last_report.lock().unwrap_or_else(|p| p.into_inner());
        *last = Some((Instant::now(), Arc::new(report.clone())));
    }

    fn last_report(&self) -> Option<(Instant, Arc<OsdStatsReport>)> {
        self.last_report
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }

    /// Exports the live families into `reg` (the daemon adds [`snapshot`] as a source of
    /// [`snapshot_metrics`]).
    pub fn register(&self, reg: &mut Registry) {
        reg.add_counter_vec(&self.ops);
        reg.add_counter_vec(&self.errors);
        reg.add_counter_vec(&self.in_bytes);
        reg.add_counter_vec(&self.out_bytes);
        reg.add_histogram_vec(&self.latency);
        reg.add_gauge(&METRICS[5], &self.in_flight);
    }
}

/// What the snapshot reads from the service besides [`OsdMetrics`].
#[derive(Debug, Clone, Copy)]
pub struct SnapshotInputs {
    pub store: kelp_store::StoreStats,
    pub io: IoCounters,
    pub recovery: RecoveryCounters,
    pub full_ratio_ppm: u32,
    pub map_epoch: u32,
}

fn unix_now_ns() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos() as u64)
        .unwrap_or(0)
}

/// Sets [`snapshot_metrics`] from the service's counters and its last report.
pub fn snapshot(metrics: &OsdMetrics, inputs: &SnapshotInputs, s: &mut Snapshot) {
    let m = &METRICS;
    let io = inputs.io;
    let rec = inputs.recovery;
    s.set(&m[6], &[], io.read_ops as f64);
    s.set(&m[7], &[], io.read_bytes as f64);
    s.set(&m[8], &[], io.write_ops as f64);
    s.set(&m[9], &[], io.write_bytes as f64);
    s.set(&m[10], &[], rec.objects as f64);
    s.set(&m[11], &[], rec.bytes as f64);
    s.set(&m[25], &[], f64::from(inputs.full_ratio_ppm) / 1_000_000.0);
    s.set(&m[26], &[], f64::from(inputs.map_epoch));
    let st = &inputs.store;
    s.set(&m[28], &[], st.onode_cache_hits as f64);
    s.set(&m[29], &[], st.onode_cache_misses as f64);
    s.set(&m[30], &[], st.onode_cache_entries as f64);
    s.set(&m[31], &[], st.onode_cache_bytes as f64);
    s.set(&m[32], &[], st.onode_cache_capacity_bytes as f64);
    s.set(&m[33], &[], st.free_extents as f64);
    s.set(&m[34], &[], st.largest_free_extent_bytes as f64);
    s.set(&m[35], &[], st.free_extent_bytes as f64);
    let Some((at, r)) = metrics.last_report() else {
        return;
    };
    let mut by_state: BTreeMap<String, u64> = BTreeMap::new();
    let (mut objects, mut bytes, mut degraded, mut misplaced, mut unfound) = (0, 0, 0, 0, 0);
    let (mut errors, mut inconsistent, mut scrubbed) = (0u64, 0u64, 0u64);
    let mut oldest_scrub_ns = u64::MAX;
    for p in &r.pgs {
        *by_state.entry(pg_state_name(&p.state)).or_default() += 1;
        objects += p.num_objects;
        bytes += p.num_bytes;
        degraded += p.num_objects_degraded;
        misplaced += p.num_objects_misplaced;
        unfound += p.num_objects_unfound;
        if let Some(sc) = &p.scrub {
            errors += sc.num_inconsistent;
            if sc.num_inconsistent > 0 {
                inconsistent += 1;
            }
            if sc.last_scrub_stamp_ns > 0 {
                scrubbed += 1;
                oldest_scrub_ns = oldest_scrub_ns.min(sc.last_scrub_stamp_ns);
            }
        }
    }
    for (state, n) in &by_state {
        s.set(&m[12], &[state], *n as f64);
    }
    s.set(&m[13], &[], objects as f64);
    s.set(&m[14], &[], bytes as f64);
    s.set(&m[15], &[], degraded as f64);
    s.set(&m[16], &[], misplaced as f64);
    s.set(&m[17], &[], unfound as f64);
    s.set(&m[18], &[], errors as f64);
    s.set(&m[19], &[], inconsistent as f64);
    s.set(&m[20], &[], scrubbed as f64);
    let oldest = if oldest_scrub_ns == u64::MAX {
        0.0
    } else {
        unix_now_ns().saturating_sub(oldest_scrub_ns) as f64 / 1e9
    };
    s.set(&m[21], &[], oldest);
    s.set(&m[22], &[], r.space.total as f64);
    s.set(&m[23], &[], r.space.used as f64);
    s.set(&m[24], &[], r.space.available as f64);
    s.set(&m[27], &[], at.elapsed().as_secs_f64());
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn op_types_skip_guards() {
        let t = |ops: &[OpKind]| OP_TYPES[op_type(ops)];
        assert_eq!(t(&[OpKind::AssertExists, OpKind::Stat]), "stat");
        assert_eq!(t(&[OpKind::Remove]), "remove");
        assert_eq!(t(&[]), "other");
    }

    #[test]
    fn table_indices_match_names() {
        assert_eq!(METRICS[5].name, "kelp_osd_ops_in_flight");
        assert_eq!(METRICS[12].name, "kelp_osd_pgs");
        assert_eq!(METRICS[21].name, "kelp_osd_oldest_scrub_age_seconds");
        assert_eq!(METRICS[25].name, "kelp_osd_full_ratio");
        assert_eq!(METRICS[27].name, "kelp_osd_stats_report_age_seconds");
        assert_eq!(METRICS[28].name, "kelp_osd_store_onode_cache_hits");
        assert_eq!(METRICS[35].name, "kelp_osd_store_free_extent_bytes");
        assert_eq!(METRICS.len(), 36);
    }
}
