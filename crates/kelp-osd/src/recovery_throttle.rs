//! Recovery's throttles (Ceph's names, from the central config, changeable at runtime) and the
//! slots that enforce them: `osd_max_backfills` PGs recover at once per primary OSD,
//! `osd_recovery_max_active` objects are copied at once per OSD, `osd_recovery_sleep` between
//! batches, and `osd_recovery_op_priority` sets recovery's share of time while clients are busy.

use std::sync::Mutex;
use std::time::Duration;

use kelp_proto::ConfigEntry;
use tokio::sync::Notify;

/// Clients' op priority (Ceph's `osd_client_op_priority`).
const CLIENT_OP_PRIORITY: u32 = 63;

/// Recovery throttles (Ceph's names), from the central config.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct RecoveryConfig {
    /// `osd_max_backfills`: PGs this OSD recovers or backfills at once, as their primary.
    pub max_backfills: usize,
    /// `osd_recovery_max_active`: objects this OSD copies at once for recovery.
    pub max_active: usize,
    /// `osd_recovery_sleep`: pause after every batch of copied objects.
    pub sleep: Duration,
    /// `osd_recovery_op_priority` (1–63): while clients use this OSD, recovery takes about
    /// `p / 63` of the time: a PG member's recovery that took `t` is followed by a pause of
    /// `t * 63 / p - t` before the slot goes to the next PG; 63 or more means no pause.
    pub op_priority: u32,
    /// `osd_snap_trim_sleep`: pause after every object the snapshot trimmer trims.
    pub snap_trim_sleep: Duration,
    /// `osd_delete_sleep`: pause after every transaction of the remover of deleted pools' PGs
    /// (`crate::pg_removal`).
    pub delete_sleep: Duration,
    /// `osd_target_transaction_size`: objects that remover deletes per transaction.
    pub delete_batch: usize,
}

impl Default for RecoveryConfig {
    fn default() -> Self {
        use kelp_config::keys;
        RecoveryConfig {
            max_backfills: keys::OSD_MAX_BACKFILLS.default.as_u64() as usize,
            max_active: keys::OSD_RECOVERY_MAX_ACTIVE.default.as_u64() as usize,
            sleep: keys::OSD_RECOVERY_SLEEP.default.as_duration(),
            op_priority: keys::OSD_RECOVERY_OP_PRIORITY.default.as_u64() as _,
            snap_trim_sleep: keys::OSD_SNAP_TRIM_SLEEP.default.as_duration(),
            delete_sleep: keys::OSD_DELETE_SLEEP.default.as_duration(),
            delete_batch: keys::OSD_TARGET_TRANSACTION_SIZE.default.as_u64() as usize,
        }
    }
}

impl RecoveryConfig {
    /// Applies one central-config key; false if it is not a recovery key or does not parse.
    pub fn set(&mut self, key: &str, value: &str) -> bool {
        match key {
            "osd_max_backfills" => match value.parse::<usize>() {
                Ok(n) if n > 0 => self.max_backfills = n,
                _ => return false,
            },
            "osd_recovery_max_active" => match value.parse::<usize>() {
                Ok(n) if n > 0 => self.max_active = n,
                _ => return false,
            },
            "osd_recovery_sleep" => match value.parse::<f64>() {
                Ok(s) if s >= 0.0 && s.is_finite() => self.sleep = Duration::from_secs_f64(s),
                _ => return false,
            },
            "osd_snap_trim_sleep" => match value.parse::<f64>() {
                Ok(s) if s >= 0.0 && s.is_finite() => {
                    self.snap_trim_sleep = Duration::from_secs_f64(s)
                }
                _ => return false,
            },
            "osd_recovery_op_priority" => match value.parse::<u32>() {
                Ok(p) if p > 0 => self.op_priority = p,
                _ => return false,
            },
            "osd_delete_sleep" => match value.parse::<f64>() {
                Ok(s) if s >= 0.0 && s.is_finite() => {
                    self.delete_sleep = Duration::from_secs_f64(s)
                }
                _ => return false,
            },
            "osd_target_transaction_size" => match value.parse::<usize>() {
                Ok(n) if n > 0 => self.delete_batch = n,
                _ => return false,
            },
            _ => return false,
        }
        true
    }

    /// This OSD's settings from the central config table: `osd.N` over `osd` over `global`
    /// over `self`.
    pub fn with_central(&self, entries: &[ConfigEntry], osd: i32) -> RecoveryConfig {
        let me = format!("osd.{osd}");
        let mut out = *self;
        for who in ["global", "osd", me.as_str()] {
            for e in entries.iter().filter(|e| e.who == who) {
                out.set(&e.key, &e.value);
            }
        }
        out
    }

    /// The pause after recovery work that took `took`, when clients are busy on this OSD.
    /// (The work itself runs at full speed: the longer a member's copy takes, the more objects
    /// clients change meanwhile, which the catch-up rounds then copy again.)
    pub fn priority_pause(&self, took: Duration, clients_busy: bool) -> Duration {
        if clients_busy && self.op_priority < CLIENT_OP_PRIORITY {
            took.mul_f64(f64::from(CLIENT_OP_PRIORITY) / f64::from(self.op_priority) - 1.0)
        } else {
            Duration::ZERO
        }
    }
}

/// Counting slots with a limit read at every acquisition (so a runtime change applies at once).
#[derive(Debug, Default)]
pub(crate) struct Slots {
    used: Mutex<usize>,
    pub(crate) freed: Notify,
}

pub(crate) struct SlotGuard<'a> {
    slots: &'a Slots,
    n: usize,
}

impl Slots {
    /// Takes `n` slots (at most `limit`) once that many are free.
    pub(crate) async fn acquire(&self, n: usize, limit: impl Fn() -> usize) -> SlotGuard<'_> {
        loop {
            let freed = self.freed.notified();
            tokio::pin!(freed);
            freed.as_mut().enable();
            {
                let mut used = self.used.lock().unwrap_or_else(|p| p.into_inner());
                let n = n.clamp(1, limit().max(1));
                if *used + n <= limit().max(1) {
                    *used += n;
                    return SlotGuard { slots: self, n };
                }
            }
            freed.await;
        }
    }
}

impl SlotGuard<'_> {
    pub(crate) fn count(&self) -> usize {
        self.n
    }
}

impl Drop for SlotGuard<'_> {
    fn drop(&mut self) {
        let mut used = self.slots.used.lock().unwrap_or_else(|p| p.into_inner());
        *used -= self.n;
        self.slots.freed.notify_waiters();
    }
}

/// This OSD's recovery throttles and slots.
#[derive(Debug, Default)]
pub(crate) struct RecoveryCtl {
    pub(crate) cfg: Mutex<RecoveryConfig>,
    /// `osd_max_backfills`: PGs recovering at once.
    pub(crate) pgs: Slots,
    /// `osd_recovery_max_active`: objects being copied at once.
    pub(crate) objects: Slots,
}

impl RecoveryCtl {
    pub(crate) fn cfg(&self) -> RecoveryConfig {
        *self.cfg.lock().unwrap_or_else(|p| p.into_inner())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;

    #[test]
    fn priority_sets_the_share_of_time_under_client_load() {
        let mut c = RecoveryConfig::default();
        let t = Duration::from_millis(100);
        c.op_priority = 63;
        assert_eq!(c.priority_pause(t, true), Duration::ZERO);
        c.op_priority = 21;
        assert_eq!(c.priority_pause(t, true), Duration::from_millis(200));
        // idle clients: no pause
        assert_eq!(c.priority_pause(t, false), Duration::ZERO);
    }

    #[test]
    fn central_config_overrides_by_specificity() {
        let e = |who: &str, key: &str, value: &str| ConfigEntry {
            who: who.into(),
            key: key.into(),
            value: value.into(),
        };
        let entries = vec![
            e("osd.2", "osd_max_backfills", "5"),
            e("osd", "osd_max_backfills", "3"),
            e("global", "osd_recovery_sleep", "0.25"),
            e("osd", "osd_recovery_op_priority", "0"),
        ];
        let base = RecoveryConfig::default();
        let c = base.with_central(&entries, 2);
        assert_eq!(c.max_backfills, 5);
        assert_eq!(c.sleep, Duration::from_millis(250));
        assert_eq!(c.op_priority, base.op_priority, "0 is refused");
        assert_eq!(base.with_central(&entries, 1).max_backfills, 3);
    }

    #[tokio::test]
    async fn slots_follow_a_changing_limit() {
        let slots = Arc::new(Slots::default());
        let limit = Arc::new(std::sync::atomic::AtomicUsize::new(1));
        let l = limit.clone();
        let a = slots
            .acquire(1, move || l.load(std::sync::atomic::Ordering::SeqCst))
            .await;
        let (s2, l2) = (slots.clone(), limit.clone());
        let waiter = tokio::spawn(async move {
            let g = s2
                .acquire(1, move || l2.load(std::sync::atomic::Ordering::SeqCst))
                .await;
            g.count()
        });
        tokio::time::sleep(Duration::from_millis(20)).await;
        assert!(!waiter.is_finished(), "over the limit: waits");
        limit.store(2, std::sync::atomic::Ordering::SeqCst);
        slots.freed.notify_waiters();
        assert_eq!(waiter.await.unwrap(), 1);
        drop(a);
        // asking for more than the limit takes the limit
        let l = limit.clone();
        let g = slots
            .acquire(10, move || l.load(std::sync::atomic::Ordering::SeqCst))
            .await;
        assert_eq!(g.count(), 2);
    }
}
