//! What the leader writes into the cluster log: the events between two looks at the cluster.
//!
//! Why a diff of views: the OSD map and the statistics already say everything (an OSD is up
//! or down, a health check is raised or not); comparing the view of one tick with the next
//! gives each change exactly once, whichever command or timer caused it. Pure: the leader's
//! loop builds the views and proposes the returned entries through Raft
//! (`MonEntry::ClusterLog`), so every monitor keeps the same log and it survives restarts.

use std::collections::{BTreeMap, BTreeSet};

use kelp_health::{HealthCheck, Severity};
use kelp_maps::OsdMap;
use kelp_proto::LogLevel;

/// One look at what the cluster log follows.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct LogView {
    /// osd id → (up, in)
    pub osds: BTreeMap<i32, (bool, bool)>,
    pub pools: BTreeSet<String>,
    pub flags: BTreeSet<String>,
    /// `None` while the leader has no statistics yet (health is then not compared).
    pub health: Option<HealthView>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HealthView {
    pub overall: Severity,
    /// check code → (severity, summary)
    pub checks: BTreeMap<String, (Severity, String)>,
}

impl LogView {
    pub fn of(map: &OsdMap, checks: Option<&[HealthCheck]>) -> LogView {
        LogView {
            osds: map
                .osds
                .iter()
                .map(|(id, o)| (*id, (o.up, o.weight > 0)))
                .collect(),
            pools: map.pools.values().map(|p| p.name.clone()).collect(),
            flags: map.flags.iter().map(|f| f.name().to_string()).collect(),
            health: checks.map(|c| HealthView {
                overall: kelp_health::overall(c),
                checks: c
                    .iter()
                    .map(|c| (c.code.to_string(), (c.severity, c.summary.clone())))
                    .collect(),
            }),
        }
    }
}

fn level(s: Severity) -> LogLevel {
    match s {
        Severity::Ok => LogLevel::Info,
        Severity::Warn => LogLevel::Warn,
        Severity::Err => LogLevel::Error,
    }
}

/// The events from `before` to `now`, with their level, in Ceph's words.
pub fn events(before: &LogView, now: &LogView) -> Vec<(LogLevel, String)> {
    let mut out = Vec::new();
    for (id, &(up, inn)) in &now.osds {
        match before.osds.get(id) {
            None => out.push((LogLevel::Info, format!("osd.{id} created"))),
            Some(&(was_up, was_in)) => {
                if was_up != up {
                    out.push(if up {
                        (LogLevel::Info, format!("osd.{id} boot"))
                    } else {
                        (LogLevel::Warn, format!("osd.{id} marked down"))
                    });
                }
                if was_in != inn {
                    out.push((
                        LogLevel::Info,
                        format!("osd.{id} marked {}", if inn { "in" } else { "out" }),
                    ));
                }
            }
        }
    }
    for id in before.osds.keys().filter(|id| !now.osds.contains_key(id)) {
        out.push((LogLevel::Info, format!("osd.{id} removed")));
    }
    for p in now.pools.difference(&before.pools) {
        out.push((LogLevel::Info, format!("pool '{p}' created")));
    }
    for p in before.pools.difference(&now.pools) {
        out.push((LogLevel::Info, format!("pool '{p}' removed")));
    }
    for f in now.flags.difference(&before.flags) {
        out.push((LogLevel::Info, format!("flag {f} set")));
    }
    for f in before.flags.difference(&now.flags) {
        out.push((LogLevel::Info, format!("flag {f} unset")));
    }
    if let (Some(b), Some(n)) = (&before.health, &now.health) {
        for (code, (sev, summary)) in &n.checks {
            match b.checks.get(code) {
                None => out.push((
                    level(*sev),
                    format!("Health check failed: {summary} ({code})"),
                )),
                // summaries change with every report (counts): log a change of severity only
                Some((was, _)) if was != sev => out.push((
                    level(*sev),
                    format!("Health check update: {summary} ({code})"),
                )),
                Some(_) => {}
            }
        }
        for (code, (_, summary)) in &b.checks {
            if !n.checks.contains_key(code) {
                out.push((
                    LogLevel::Info,
                    format!("Health check cleared: {code} (was: {summary})"),
                ));
            }
        }
        if b.overall != n.overall && n.overall == Severity::Ok {
            out.push((LogLevel::Info, "Cluster is now healthy".to_string()));
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn view(osds: &[(i32, bool, bool)], checks: &[(&str, Severity)]) -> LogView {
        LogView {
            osds: osds.iter().map(|&(i, u, n)| (i, (u, n))).collect(),
            pools: BTreeSet::new(),
            flags: BTreeSet::new(),
            health: Some(HealthView {
                overall: checks.iter().map(|c| c.1).max().unwrap_or(Severity::Ok),
                checks: checks
                    .iter()
                    .map(|(c, s)| (c.to_string(), (*s, format!("{c} summary"))))
                    .collect(),
            }),
        }
    }

    #[test]
    fn osd_and_health_changes_are_logged_once() {
        let a = view(&[(0, true, true), (1, true, true)], &[]);
        let b = view(
            &[(0, true, true), (1, false, true)],
            &[("OSD_DOWN", Severity::Warn)],
        );
        let ev = events(&a, &b);
        assert_eq!(
            ev,
            vec![
                (LogLevel::Warn, "osd.1 marked down".to_string()),
                (
                    LogLevel::Warn,
                    "Health check failed: OSD_DOWN summary (OSD_DOWN)".to_string()
                ),
            ]
        );
        assert!(events(&b, &b).is_empty());
        let c = view(&[(0, true, true), (1, true, false)], &[]);
        let ev = events(&b, &c);
        assert!(ev.contains(&(LogLevel::Info, "osd.1 boot".to_string())));
        assert!(ev.contains(&(LogLevel::Info, "osd.1 marked out".to_string())));
        assert!(ev.contains(&(
            LogLevel::Info,
            "Health check cleared: OSD_DOWN (was: OSD_DOWN summary)".to_string()
        )));
        assert!(ev.contains(&(LogLevel::Info, "Cluster is now healthy".to_string())));
        // no statistics yet: health is not compared
        let mut d = c.clone();
        d.health = None;
        assert!(events(&b, &d).iter().all(|(_, m)| !m.contains("Health")));
    }
}
