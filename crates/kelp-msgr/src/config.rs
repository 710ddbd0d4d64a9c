//! Messenger configuration: one serde struct, a default for every field, unknown keys refused.

use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::frame::Limits;

/// Tunables of a [`crate::Messenger`]. Durations are in milliseconds so that config files stay
/// plain numbers.
///
/// ```
/// let cfg: kelp_msgr::MsgrConfig =
///     serde_json::from_str(r#"{"max_in_flight_requests": 64}"#).unwrap();
/// assert_eq!(cfg.max_in_flight_requests, 64);
/// assert_eq!(cfg.max_data_len, 256 << 20);
/// ```
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct MsgrConfig {
    /// Largest accepted (and sendable) meta segment, bytes. Default 16 MiB.
    pub max_meta_len: u32,
    /// Largest accepted (and sendable) data segment, bytes. Default 256 MiB.
    pub max_data_len: u32,
    /// Deadline for the whole handshake, both directions. Default 10 s.
    pub handshake_timeout_ms: u64,
    /// Deadline for the TCP connect. Default 5 s.
    pub connect_timeout_ms: u64,
    /// Once a frame header has arrived, its body must follow within this. Default 60 s.
    pub frame_body_timeout_ms: u64,
    /// Requests from one peer handled at once; further requests wait (and, once the socket
    /// buffers fill, the peer's writes block): backpressure. Default 256.
    ///
    /// While a connection is at this cap its reader waits, so responses to calls *this* end
    /// made on the same connection wait too: a handler must not call back over the connection
    /// it is serving and wait for the answer (use another connection, or do not wait).
    pub max_in_flight_requests: usize,
    /// Frames queued for one connection's writer before senders wait. Default 1024.
    pub send_queue_len: usize,
    /// One-way messages queued for the dispatcher of one connection before the reader waits.
    /// Default 1024.
    pub message_queue_len: usize,
    /// First delay before redialling a peer after a failed connect. Default 50 ms.
    pub reconnect_backoff_min_ms: u64,
    /// Cap of the doubling redial delay. Default 2 s.
    pub reconnect_backoff_max_ms: u64,
    /// Inbound connections allowed to be in the handshake at once; further ones are closed at
    /// once (protects the listener from connection floods). Default 1024.
    pub max_pending_handshakes: usize,
    /// Each end sends a keepalive frame this often. 0 disables keepalives (and the dead-peer
    /// check below). Default 5 s.
    pub keepalive_interval_ms: u64,
    /// A connection on which nothing at all (not even a keepalive) has arrived for this long is
    /// closed as dead: pending calls fail with `ConnectionLost` and the next call redials.
    /// Catches peers that vanished without closing (host down, real partition). Default 30 s.
    pub keepalive_timeout_ms: u64,
}

impl Default for MsgrConfig {
    fn default() -> Self {
        Self {
            max_meta_len: 16 << 20,
            max_data_len: 256 << 20,
            handshake_timeout_ms: 10_000,
            connect_timeout_ms: 5_000,
            frame_body_timeout_ms: 60_000,
            max_in_flight_requests: 256,
            send_queue_len: 1024,
            message_queue_len: 1024,
            reconnect_backoff_min_ms: 50,
            reconnect_backoff_max_ms: 2_000,
            max_pending_handshakes: 1024,
            keepalive_interval_ms: 5_000,
            keepalive_timeout_ms: 30_000,
        }
    }
}

impl MsgrConfig {
    pub(crate) fn limits(&self) -> Limits {
        Limits {
            max_meta_len: self.max_meta_len,
            max_data_len: self.max_data_len,
        }
    }
    pub(crate) fn handshake_timeout(&self) -> Duration {
        Duration::from_millis(self.handshake_timeout_ms)
    }
    pub(crate) fn connect_timeout(&self) -> Duration {
        Duration::from_millis(self.connect_timeout_ms)
    }
    pub(crate) fn frame_body_timeout(&self) -> Duration {
        Duration::from_millis(self.frame_body_timeout_ms)
    }
    /// `None` when keepalives are disabled.
    pub(crate) fn keepalive(&self) -> Option<(Duration, Duration)> {
        (self.keepalive_interval_ms > 0).then(|| {
            let interval = Duration::from_millis(self.keepalive_interval_ms);
            let timeout = Duration::from_millis(self.keepalive_timeout_ms).max(interval * 2);
            (interval, timeout)
        })
    }
    pub(crate) fn backoff_min(&self) -> Duration {
        Duration::from_millis(self.reconnect_backoff_min_ms)
    }
    pub(crate) fn backoff_max(&self) -> Duration {
        Duration::from_millis(
            self.reconnect_backoff_max_ms
                .max(self.reconnect_backoff_min_ms),
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unknown_keys_refused() {
        assert!(serde_json::from_str::<MsgrConfig>(r#"{"max_meta_lenn": 1}"#).is_err());
        assert_eq!(
            serde_json::from_str::<MsgrConfig>("{}").unwrap(),
            MsgrConfig::default()
        );
    }
}
