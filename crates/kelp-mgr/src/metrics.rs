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
    reg.register_msgr(move || msgr_counts(&msgrs));
    reg.snapshot(METRICS, move |s| {
        s.set(&METRICS[0], &[], f64::from(u8::from(shared.is_active())));
        let items = shared.progress.read().unwrap_or_else(|p| p.into_inner());
        let running = items.iter().filter(|i| i.finished_ms.is_none()).count();
        s.set(&METRICS[1], &["running"], running as f64);
        s.set(&METRICS[1], &["finished"], (items.len() - running) as f64);
    });
}

/// The manager's messengers' counters (its RADOS client's: to the OSDs and the monitors).
fn msgr_counts(msgrs: &[kelp_msgr::Messenger]) -> kelp_metrics::MsgrCounts {
    let mut s = kelp_msgr::MsgrStats::default();
    let mut peers = 0;
    for m in msgrs {
        s.add(&m.stats());
        peers += m.peers().len() as u64;
    }
    kelp_metrics::MsgrCounts {
        peers,
        connections_accepted: s.connections_accepted,
        connections_dialed: s.connections_dialed,
        handshake_failures: s.handshake_failures,
        auth_failures: s.auth_failures,
        frame_errors: s.frame_errors,
        frames_sent: s.frames_sent,
        flushes: s.flushes,
        connect_failures: s.connect_failures,
        by_peer: kelp_msgr::PEER_TYPES
            .iter()
            .zip(&s.by_peer)
            .map(|(peer, p)| kelp_metrics::MsgrPeerCounts {
                peer,
                bytes_sent: p.bytes_sent,
                bytes_received: p.bytes_received,
                messages_sent: p.messages_sent,
                messages_received: p.messages_received,
                connections_open: p.connections_open,
                connections_closed: p.connections_closed,
                connection_errors: p.connection_errors,
                reconnects: p.reconnects,
            })
            .collect(),
    }
}
