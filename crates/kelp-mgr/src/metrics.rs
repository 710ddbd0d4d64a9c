//! The manager's own Prometheus metrics (`/metrics`, see `kelp_metrics`): whether this daemon
//! is the active manager and how many long operations it follows. Cluster-wide series come
//! from the monitors and OSDs themselves (every daemon serves its own); the manager does not
//! re-export them, so that losing it loses no metrics.

use std::sync::Arc;

use kelp_metrics::{MetricDef, MetricTable, MetricType as T, Registry};

use crate::daemon::Shared;

pub static METRICS: &[MetricDef] = &[
    MetricDef {
        name: "kelp_mgr_active",
        kind: T::Gauge,
        help: "1 while this manager is the active one (serves the dashboard and follows long work), 0 while it is a standby.",
        labels: &[],
    },
    MetricDef {
        name: "kelp_mgr_progress_items",
        kind: T::Gauge,
        help: "Long operations (recovery, backfill, scrub, reshard) the active manager follows, by state (running, finished).",
        labels: &["state"],
    },
];

pub static TABLE: MetricTable = MetricTable {
    daemon: "mgr",
    metrics: METRICS,
};

/// Registers the manager's series, read from `shared` at scrape time.
pub fn register(reg: &mut Registry, shared: Arc<Shared>) {
    let msgrs = shared.rados.messengers();
    reg.register_msgr(move || kelp_msgr::metrics_counts(&msgrs));
    reg.snapshot(METRICS, move |s| {
        s.set(&METRICS[0], &[], f64::from(u8::from(shared.is_active())));
        let items = shared.progress.read().unwrap_or_else(|p| p.into_inner());
        let running = items.iter().filter(|i| i.finished_ms.is_none()).count();
        s.set(&METRICS[1], &["running"], running as f64);
        s.set(&METRICS[1], &["finished"], (items.len() - running) as f64);
    });
}
