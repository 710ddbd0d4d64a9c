#![allow(clippy::unwrap_used)]

use super::*;
use std::sync::Arc;

static T: &[MetricDef] = &[
    MetricDef {
        name: "kelp_test_ops",
        kind: MetricType::Counter,
        help: "Ops.",
        labels: &["op"],
    },
    MetricDef {
        name: "kelp_test_latency_seconds",
        kind: MetricType::Histogram,
        help: "Latency.",
        labels: &["op"],
    },
    MetricDef {
        name: "kelp_test_pgs",
        kind: MetricType::Gauge,
        help: "PGs by state.",
        labels: &["state"],
    },
    MetricDef {
        name: "kelp_test_depth",
        kind: MetricType::Gauge,
        help: "Depth.",
        labels: &[],
    },
];

fn registry() -> (Registry, CounterVec, HistogramVec, Gauge) {
    let mut r = Registry::new();
    let ops = r.counter_vec(&T[0]);
    let lat = r.histogram_vec(&T[1], LATENCY_BUCKETS);
    r.snapshot(&T[2..3], |s| {
        s.set(&T[2], &["active+clean"], 7.0);
        s.set(&T[2], &["peering"], 1.0);
    });
    let depth = r.gauge(&T[3]);
    r.register_common("osd.0", "osd");
    (r, ops, lat, depth)
}

#[test]
fn encodes_live_and_snapshot_metrics() {
    let (r, ops, lat, depth) = registry();
    ops.with(&["write"]).inc_by(3);
    lat.with(&["write"]).observe(0.002);
    depth.set(4);
    let text = r.encode_prometheus().unwrap();
    assert!(
        text.contains("kelp_test_ops_total{op=\"write\"} 3"),
        "{text}"
    );
    assert!(
        text.contains("kelp_test_latency_seconds_count{op=\"write\"} 1"),
        "{text}"
    );
    assert!(
        text.contains("kelp_test_pgs{state=\"active+clean\"} 7"),
        "{text}"
    );
    assert!(text.contains("kelp_test_depth 4"), "{text}");
    // the encoder adds the final period itself
    assert!(text.contains("# HELP kelp_test_ops_total Ops.\n"), "{text}");
    assert!(
        text.contains("kelp_daemon_info{daemon=\"osd.0\",kind=\"osd\""),
        "{text}"
    );
    assert!(text.contains("process_resident_memory_bytes "), "{text}");
    assert!(text.contains("process_cpu_seconds_total "), "{text}");
    let om = r.encode_openmetrics().unwrap();
    assert!(om.trim_end().ends_with("# EOF"), "{om}");
    assert_eq!(r.defs().len(), T.len() + COMMON_METRICS.len());
}

#[test]
fn top_k_keeps_the_largest_and_sums_the_rest() {
    let items = vec![
        ("a".to_string(), 5u64),
        ("b".to_string(), 50),
        ("c".to_string(), 1),
        ("d".to_string(), 7),
    ];
    let top = top_k(items, 2, |v| *v, |a, b| *a += *b);
    assert_eq!(
        top,
        vec![
            ("b".to_string(), 50),
            ("d".to_string(), 7),
            ("other".to_string(), 6)
        ]
    );
}

#[test]
fn doc_lists_every_metric() {
    let md = doc::markdown(&[MetricTable {
        daemon: "osd",
        metrics: T,
    }]);
    assert!(
        md.contains("| `kelp_test_ops_total` | counter | `op` |"),
        "{md}"
    );
    assert!(
        md.contains("`kelp_test_latency_seconds` | histogram"),
        "{md}"
    );
}

#[tokio::test]
async fn serves_metrics_over_http() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let (r, ops, _, _) = registry();
    ops.with(&["read"]).inc();
    let server = serve("127.0.0.1:0".parse().unwrap(), Arc::new(r))
        .await
        .unwrap();
    let mut s = tokio::net::TcpStream::connect(server.local_addr())
        .await
        .unwrap();
    s.write_all(b"GET /metrics HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
        .await
        .unwrap();
    let mut body = String::new();
    s.read_to_string(&mut body).await.unwrap();
    assert!(body.starts_with("HTTP/1.1 200"), "{body}");
    assert!(
        body.contains("kelp_test_ops_total{op=\"read\"} 1"),
        "{body}"
    );
}
