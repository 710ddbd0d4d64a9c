//! Peer heartbeats: each OSD pings the OSDs it shares PGs with and reports to the monitors
//! the ones that stay silent past `osd_heartbeat_grace`.
//!
//! Why: the monitors notice an OSD whose process is gone (its session drops), but not one that
//! is alive at the TCP level and yet does nothing (frozen with SIGSTOP, stuck on a dead disk,
//! swapping): its peers notice, because their pings go unanswered.
//!
//! Pieces:
//! - [`heartbeat_peers`] (pure): the up OSDs sharing a PG (up or acting set) with this one,
//!   topped up with the next up OSDs by id until there are `osd_heartbeat_min_peers` (as Ceph
//!   does), so an OSD without PGs is watched too;
//! - [`PeerHealth`] (pure): last answer per peer, which peers are failed and which reports to
//!   send or withdraw; if this OSD itself stalls (a tick comes much later than due), every
//!   peer gets a fresh grace instead of being reported for our own silence;
//! - [`run`]: the task that pings every `osd_heartbeat_interval` over the OSD's messenger
//!   (`OSD_PING`, at most one ping in flight per peer) and sends the reports through the
//!   `MonClient` (a standing report is resent every interval until the peer answers or is
//!   marked down; an answer after a report sends a withdrawal). A peer whose address refuses
//!   the connection (the process is gone, nothing listens) is reported at once, without waiting
//!   for the grace (Ceph's `osd_fast_fail_on_connection_refused`): a killed OSD is marked down
//!   in about a heartbeat interval instead of a grace.
//!
//! Settings come from the monitors' central config (`osd.N`, then `osd`, then `global`),
//! re-read every few seconds.

use std::collections::{BTreeMap, BTreeSet};
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use kelp_maps::OsdMap;
use kelp_monc::MonClient;
use kelp_msgr::Messenger;
use kelp_proto::{MonCommand, MonReply, OsdFailure, OsdPing, OsdPingReply, msg_type};
use kelp_types::PgId;
use tokio::sync::mpsc;
use tracing::{debug, info, warn};

use crate::service::OsdService;

/// Heartbeat settings (Ceph's names).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct HeartbeatConfig {
    /// `osd_heartbeat_interval`: time between pings to one peer. Default 1 s (Ceph: 6 s).
    pub interval: Duration,
    /// `osd_heartbeat_grace`: a peer silent this long is reported failed. Default 6 s (Ceph:
    /// 20 s).
    pub grace: Duration,
    /// `osd_heartbeat_min_peers`: peers watched at least, when PGs give fewer. Default 10.
    pub min_peers: usize,
}

impl Default for HeartbeatConfig {
    fn default() -> Self {
        use kelp_config::keys;
        HeartbeatConfig {
            interval: keys::OSD_HEARTBEAT_INTERVAL.default.as_duration(),
            grace: keys::OSD_HEARTBEAT_GRACE.default.as_duration(),
            min_peers: 10,
        }
    }
}

/// The up OSDs this one heartbeats in `map` (never itself).
pub fn heartbeat_peers(map: &OsdMap, me: i32, min_peers: usize) -> BTreeMap<i32, u32> {
    let mut peers = BTreeSet::new();
    for pool in map.pools.values() {
        for seed in 0..pool.pg_num {
            let Ok(m) = map.pg_mapping(PgId::new(pool.id, seed)) else {
                continue;
            };
            if m.up.contains(&me) || m.acting.contains(&me) {
                peers.extend(m.up.iter().chain(&m.acting).copied());
            }
        }
    }
    peers.remove(&me);
    peers.retain(|o| map.is_up(*o));
    if peers.len() < min_peers {
        // Neighbours by id, wrapping around, as Ceph's "next up OSDs".
        let ids: Vec<i32> = map
            .osds
            .values()
            .filter(|o| o.up && o.id != me)
            .map(|o| o.id)
            .collect();
        let start = ids.iter().position(|&o| o > me).unwrap_or(0);
        for i in 0..ids.len() {
            if peers.len() >= min_peers {
                break;
            }
            peers.insert(ids[(start + i) % ids.len()]);
        }
    }
    peers
        .into_iter()
        .filter_map(|o| map.osds.get(&o).map(|info| (o, info.up_from)))
        .collect()
}

#[derive(Debug, Clone, Copy)]
struct Peer {
    up_from: u32,
    /// Last answer (or when we started watching it).
    last_rx: Instant,
    /// A failure report about it stands.
    reported: bool,
}

/// Per-peer heartbeat bookkeeping (pure: time is passed in).
#[derive(Debug)]
pub struct PeerHealth {
    me: i32,
    peers: BTreeMap<i32, Peer>,
    last_tick: Option<Instant>,
}

impl PeerHealth {
    pub fn new(me: i32) -> PeerHealth {
        PeerHealth {
            me,
            peers: BTreeMap::new(),
            last_tick: None,
        }
    }

    /// Watches exactly `peers` (id → `up_from`): new ones, or re-booted ones, start with a
    /// full grace; peers no longer listed are forgotten (a peer marked down needs no report).
    pub fn set_peers(&mut self, peers: &BTreeMap<i32, u32>, now: Instant) {
        self.peers.retain(|id, p| peers.get(id) == Some(&p.up_from));
        for (&id, &up_from) in peers {
            self.peers.entry(id).or_insert(Peer {
                up_from,
                last_rx: now,
                reported: false,
            });
        }
    }

    pub fn peers(&self) -> impl Iterator<Item = i32> + '_ {
        self.peers.keys().copied()
    }

    /// A peer answered: if it had been reported, the withdrawal to send.
    pub fn answered(&mut self, osd: i32, now: Instant) -> Option<OsdFailure> {
        let p = self.peers.get_mut(&osd)?;
        p.last_rx = p.last_rx.max(now);
        if !p.reported {
            return None;
        }
        p.reported = false;
        Some(OsdFailure {
            reporter: self.me,
            target: osd,
            target_up_from: p.up_from,
            failed_for_ms: 0,
            alive: true,
        })
    }

    /// A peer refused our connection (nothing listens at its address: the process is gone):
    /// the failure report to send now, without waiting for the grace.
    pub fn refused(&mut self, osd: i32, now: Instant) -> Option<OsdFailure> {
        let p = self.peers.get_mut(&osd)?;
        p.reported = true;
        Some(OsdFailure {
            reporter: self.me,
            target: osd,
            target_up_from: p.up_from,
            failed_for_ms: now.saturating_duration_since(p.last_rx).as_millis() as u64,
            alive: false,
        })
    }

    /// One heartbeat period has passed: the failure reports to send (standing ones again).
    pub fn tick(&mut self, now: Instant, cfg: &HeartbeatConfig) -> Vec<OsdFailure> {
        let stalled = self.last_tick.is_some_and(|t| {
            now.saturating_duration_since(t) > (cfg.grace / 2).max(cfg.interval * 2)
        });
        self.last_tick = Some(now);
        if stalled {
            // We were frozen or starved ourselves: the silence is ours, not the peers'.
            for p in self.peers.values_mut() {
                p.last_rx = p.last_rx.max(now);
            }
            return Vec::new();
        }
        let mut out = Vec::new();
        for (&id, p) in &mut self.peers {
            let silent = now.saturating_duration_since(p.last_rx);
            if silent > cfg.grace {
                p.reported = true;
                out.push(OsdFailure {
                    reporter: self.me,
                    target: id,
                    target_up_from: p.up_from,
                    failed_for_ms: silent.as_millis() as u64,
                    alive: false,
                });
            }
        }
        out
    }
}

/// Reads the heartbeat settings for `osd.<id>` from the central config (defaults for the rest).
async fn fetch_config(mon: &MonClient, id: i32, min_peers: usize) -> Option<HeartbeatConfig> {
    let reply = tokio::time::timeout(Duration::from_secs(5), mon.command(&MonCommand::ConfigDump))
        .await
        .ok()?
        .ok()?;
    let MonReply::Config(entries) = reply else {
        return None;
    };
    let me = format!("osd.{id}");
    let value = |key: &str| -> Option<f64> {
        ["global", "osd", me.as_str()]
            .iter()
            .rev()
            .find_map(|who| {
                entries
                    .iter()
                    .find(|e| e.who == *who && e.key == key)
                    .map(|e| e.value.clone())
            })
            .and_then(|v| v.parse::<f64>().ok())
            .filter(|v| v.is_finite() && *v > 0.0)
    };
    let d = HeartbeatConfig::default();
    Some(HeartbeatConfig {
        interval: value("osd_heartbeat_interval").map_or(d.interval, Duration::from_secs_f64),
        grace: value("osd_heartbeat_grace").map_or(d.grace, Duration::from_secs_f64),
        min_peers,
    })
}

/// How a ping ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Pong {
    Answered,
    /// The connection was refused: nothing listens at the peer's address.
    Refused,
    /// No (valid) answer: a timeout, a lost connection, a frozen peer.
    Silent,
}

async fn ping(msgr: &Messenger, me: i32, epoch: u32, addr: SocketAddr, timeout: Duration) -> Pong {
    let meta = kelp_proto::encode(&OsdPing { from: me, epoch });
    match msgr
        .connection(addr)
        .call(msg_type::OSD_PING, meta, Bytes::new(), timeout)
        .await
    {
        Ok(resp) if kelp_proto::decode::<OsdPingReply>(&resp.meta, "OsdPingReply").is_ok() => {
            Pong::Answered
        }
        Ok(_) => Pong::Silent,
        // The messenger keeps the OS error's text ("Connection refused (os error 111)").
        Err(kelp_msgr::MsgrError::ConnectFailed { reason, .. })
            if reason.to_ascii_lowercase().contains("connection refused") =>
        {
            Pong::Refused
        }
        Err(_) => Pong::Silent,
    }
}

/// Sends reports one batch at a time (a slow monitor must not pile up tasks).
fn send_reports(
    mon: &Arc<MonClient>,
    reports: Vec<OsdFailure>,
    busy: &Arc<std::sync::atomic::AtomicBool>,
    timeout: Duration,
) {
    use std::sync::atomic::Ordering;
    if reports.is_empty() || busy.swap(true, Ordering::AcqRel) {
        return;
    }
    let (mon, busy) = (mon.clone(), busy.clone());
    tokio::spawn(async move {
        for r in reports {
            if let Err(e) = mon.osd_failure(&r, timeout).await {
                debug!(target = r.target, "failure report not delivered: {e}");
            }
        }
        busy.store(false, Ordering::Release);
    });
}

/// The heartbeat task of an OSD; runs until dropped/aborted.
pub async fn run(service: Arc<OsdService>, msgr: Messenger, mon: Arc<MonClient>) {
    let me = service.id();
    let mut cfg = HeartbeatConfig::default();
    let mut health = PeerHealth::new(me);
    let mut in_flight: BTreeSet<i32> = BTreeSet::new();
    let (tx, mut rx) = mpsc::unbounded_channel::<(i32, Pong)>();
    let busy = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let mut last_config = None::<Instant>;
    let mut next_tick = Instant::now();
    loop {
        // Drain answers until the next tick.
        let sleep = tokio::time::sleep_until(next_tick.into());
        tokio::pin!(sleep);
        loop {
            tokio::select! {
                () = &mut sleep => break,
                Some((osd, pong)) = rx.recv() => {
                    in_flight.remove(&osd);
                    match pong {
                        Pong::Answered => {
                            if let Some(cancel) = health.answered(osd, Instant::now()) {
                                info!(
                                    osd,
                                    "heartbeat peer answers again; withdrawing the failure report"
                                );
                                send_reports(&mon, vec![cancel], &busy, cfg.grace);
                            }
                        }
                        Pong::Refused => {
                            if let Some(report) = health.refused(osd, Instant::now()) {
                                debug!(osd, "heartbeat peer refuses connections; reporting it");
                                send_reports(&mon, vec![report], &busy, cfg.grace);
                            }
                        }
                        Pong::Silent => {}
                    }
                }
            }
        }
        let now = Instant::now();
        if last_config.is_none_or(|t| now.duration_since(t) > Duration::from_secs(5)) {
            last_config = Some(now);
            if let Some(c) = fetch_config(&mon, me, cfg.min_peers).await
                && c != cfg
            {
                debug!(?c, "heartbeat settings");
                cfg = c;
            }
        }
        let map = service.map();
        let peers = heartbeat_peers(&map, me, cfg.min_peers);
        let now = Instant::now();
        health.set_peers(&peers, now);
        let reports = health.tick(now, &cfg);
        for r in &reports {
            if r.failed_for_ms < (cfg.grace + cfg.interval).as_millis() as u64 {
                warn!(
                    osd = r.target,
                    silent_ms = r.failed_for_ms,
                    "heartbeat peer silent past the grace; reporting it failed"
                );
            }
        }
        send_reports(&mon, reports, &busy, cfg.grace);
        for osd in health.peers().collect::<Vec<_>>() {
            if in_flight.contains(&osd) {
                continue;
            }
            let Some(addr) = map.osds.get(&osd).and_then(|o| o.addr) else {
                continue;
            };
            in_flight.insert(osd);
            let (msgr, tx, epoch, timeout) = (msgr.clone(), tx.clone(), map.epoch, cfg.grace);
            tokio::spawn(async move {
                let pong = ping(&msgr, me, epoch, addr, timeout).await;
                let _ = tx.send((osd, pong));
            });
        }
        next_tick = Instant::now() + cfg.interval;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn map_with(n: i32, pool_size: u32) -> OsdMap {
        let mut map = OsdMap::new("fsid", "osd").unwrap();
        for i in 0..n {
            let (_, inc) = map
                .propose_osd_create_with_id(&format!("u{i}"), "h", 0x10000, Some(i))
                .unwrap();
            map.apply(&inc.unwrap()).unwrap();
            let addr = format!("127.0.0.1:{}", 7000 + i).parse().unwrap();
            let inc = map.propose_osd_boot(i, addr).unwrap().unwrap();
            map.apply(&inc).unwrap();
        }
        if pool_size > 0 {
            let spec = kelp_maps::PoolSpec {
                name: "p".into(),
                size: Some(pool_size),
                pg_num: Some(8),
                ..Default::default()
            };
            let (_, inc) = map.propose_pool_create(&spec).unwrap();
            map.apply(&inc).unwrap();
        }
        map
    }

    #[test]
    fn peers_are_pg_mates_topped_up_with_neighbours() {
        let map = map_with(4, 3);
        let peers = heartbeat_peers(&map, 0, 0);
        assert!(!peers.is_empty());
        assert!(!peers.contains_key(&0));
        // min_peers tops up with every other up OSD.
        let all = heartbeat_peers(&map, 0, 10);
        assert_eq!(all.keys().copied().collect::<Vec<_>>(), vec![1, 2, 3]);
        // No pools: only neighbours, wrapping around.
        let map = map_with(5, 0);
        assert_eq!(
            heartbeat_peers(&map, 3, 2)
                .keys()
                .copied()
                .collect::<Vec<_>>(),
            vec![0, 4]
        );
        // Down OSDs are not watched.
        let mut map = map_with(3, 3);
        let inc = map.propose_osd_down(2).unwrap().unwrap();
        map.apply(&inc).unwrap();
        assert_eq!(
            heartbeat_peers(&map, 0, 10)
                .keys()
                .copied()
                .collect::<Vec<_>>(),
            vec![1]
        );
    }

    #[test]
    fn silent_peers_are_reported_until_they_answer() {
        let cfg = HeartbeatConfig::default();
        let t0 = Instant::now();
        let s = Duration::from_secs;
        let mut h = PeerHealth::new(0);
        h.set_peers(&BTreeMap::from([(1, 5), (2, 5)]), t0);
        for i in 1..=6 {
            h.answered(1, t0 + s(i));
            assert!(h.tick(t0 + s(i), &cfg).is_empty(), "tick {i}");
        }
        h.answered(1, t0 + s(7));
        let r = h.tick(t0 + s(7), &cfg);
        assert_eq!(r.len(), 1);
        assert_eq!((r[0].reporter, r[0].target, r[0].target_up_from), (0, 2, 5));
        assert!(!r[0].alive && r[0].failed_for_ms == 7000);
        // Resent while silent.
        h.answered(1, t0 + s(8));
        assert_eq!(h.tick(t0 + s(8), &cfg).len(), 1);
        // It answers: a withdrawal, once.
        let cancel = h.answered(2, t0 + s(9)).expect("withdrawal");
        assert!(cancel.alive && cancel.target == 2);
        assert!(h.answered(2, t0 + s(9)).is_none());
        assert!(h.tick(t0 + s(9), &cfg).is_empty());
        // Re-booted peer (new up_from): a fresh grace.
        h.set_peers(&BTreeMap::from([(1, 5), (2, 9)]), t0 + s(20));
        h.answered(1, t0 + s(20));
        assert!(h.tick(t0 + s(20), &cfg).is_empty());
    }

    #[test]
    fn a_refused_connection_is_reported_at_once() {
        let cfg = HeartbeatConfig::default();
        let t0 = Instant::now();
        let s = Duration::from_secs;
        let mut h = PeerHealth::new(0);
        h.set_peers(&BTreeMap::from([(1, 5)]), t0);
        h.answered(1, t0 + s(1));
        let r = h.refused(1, t0 + s(2)).expect("a report before the grace");
        assert_eq!((r.target, r.target_up_from, r.alive), (1, 5, false));
        assert_eq!(r.failed_for_ms, 1000);
        assert!(h.refused(9, t0).is_none(), "not a peer");
        // It comes back: the report is withdrawn.
        assert!(h.answered(1, t0 + s(3)).is_some_and(|c| c.alive));
        assert!(h.tick(t0 + s(3), &cfg).is_empty());
    }

    #[test]
    fn our_own_stall_is_not_blamed_on_peers() {
        let cfg = HeartbeatConfig::default();
        let t0 = Instant::now();
        let s = Duration::from_secs;
        let mut h = PeerHealth::new(0);
        h.set_peers(&BTreeMap::from([(1, 5)]), t0);
        assert!(h.tick(t0, &cfg).is_empty());
        // Frozen for 30 s: the next tick resets the clocks instead of reporting.
        assert!(h.tick(t0 + s(30), &cfg).is_empty());
        assert!(h.tick(t0 + s(31), &cfg).is_empty());
        // But a peer that then stays silent is reported after a grace.
        assert_eq!(h.tick(t0 + s(32), &cfg).len(), 0);
        for i in 33..=36 {
            h.tick(t0 + s(i), &cfg);
        }
        assert_eq!(h.tick(t0 + s(37), &cfg).len(), 1);
    }
}
