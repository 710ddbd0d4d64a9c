//! `docs/METRICS.md`'s reference section, generated from the metric tables.

use crate::{MetricTable, MetricType};

/// A Markdown section per table: one row per metric with its exported name, type, labels and
/// meaning. Histograms note their `_bucket`/`_sum`/`_count` series.
pub fn markdown(tables: &[MetricTable]) -> String {
    let mut out = String::new();
    for t in tables {
        let who = match t.daemon {
            "all" => "Every daemon".to_string(),
            d => d
                .split(',')
                .map(|d| format!("`kelp {d}`"))
                .collect::<Vec<_>>()
                .join(", "),
        };
        out.push_str(&format!("### {who}\n\n"));
        out.push_str("| metric | type | labels | meaning |\n|---|---|---|---|\n");
        for m in t.metrics {
            let labels = if m.labels.is_empty() {
                "—".to_string()
            } else {
                m.labels
                    .iter()
                    .map(|l| format!("`{l}`"))
                    .collect::<Vec<_>>()
                    .join(", ")
            };
            let mut help = m.help.replace('|', "\\|");
            if m.kind == MetricType::Histogram {
                help.push_str(" (series `_bucket{le}`, `_sum`, `_count`)");
            }
            out.push_str(&format!(
                "| `{}` | {} | {} | {} |\n",
                m.exported_name(),
                m.kind.as_str(),
                labels,
                help
            ));
        }
        out.push('\n');
    }
    out
}
