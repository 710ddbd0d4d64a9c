//! The messenger: listens, dials, authenticates, and caches one connection per peer address.
//!
//! Ownership is arranged so that dropping the last [`Messenger`] handle shuts everything down:
//! tasks hold only the shared [`Core`] (config, keys, dispatcher, policy), never the connection
//! cache, and the cache holds connection slots, not the messenger. A [`Connection`] that
//! outlives its messenger fails its calls with [`MsgrError::Shutdown`].

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, Weak};
use std::time::Duration;

use async_trait::async_trait;
use bytes::Bytes;
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{mpsc, watch};
use tokio::time::Instant;
use tracing::{debug, info, warn};

use crate::auth::{KeyLookup, Secret, validate_entity};
use crate::config::MsgrConfig;
use crate::error::{MsgrError, Result};
use crate::handshake;
use crate::policy::NetworkPolicy;
use crate::session::{
    Direction, Dispatcher, Message, Peer, Response, Session, SessionParams, close_arc,
};

/// Counters, for health output and for tests that must see the server side of a failure.
#[derive(Debug, Default)]
pub(crate) struct Stats {
    pub connections_accepted: AtomicU64,
    pub connections_dialed: AtomicU64,
    pub handshake_failures: AtomicU64,
    pub auth_failures: AtomicU64,
    pub frame_errors: AtomicU64,
    pub frames_sent: AtomicU64,
    pub flushes: AtomicU64,
    pub connect_failures: AtomicU64,
    /// Indexed by [`peer_type`]: a closed set, so the counters are a fixed array.
    pub by_peer: [PeerCounters; PEER_TYPES.len()],
}

/// Traffic and connection counters of one kind of peer (relaxed atomics: the data path adds
/// to them and never waits).
#[derive(Debug, Default)]
pub(crate) struct PeerCounters {
    pub bytes_sent: AtomicU64,
    pub bytes_received: AtomicU64,
    pub messages_sent: AtomicU64,
    pub messages_received: AtomicU64,
    pub connections_open: AtomicU64,
    pub connections_closed: AtomicU64,
    pub connection_errors: AtomicU64,
    pub reconnects: AtomicU64,
}

impl PeerCounters {
    fn snapshot(&self) -> PeerStats {
        let l = |a: &AtomicU64| a.load(Ordering::Relaxed);
        PeerStats {
            bytes_sent: l(&self.bytes_sent),
            bytes_received: l(&self.bytes_received),
            messages_sent: l(&self.messages_sent),
            messages_received: l(&self.messages_received),
            connections_open: l(&self.connections_open),
            connections_closed: l(&self.connections_closed),
            connection_errors: l(&self.connection_errors),
            reconnects: l(&self.reconnects),
        }
    }
}

/// The kinds of peer traffic is counted by ([`MsgrStats::by_peer`]): the type part of the
/// peer's entity name (`osd` of `osd.3`), anything else is `other`. A closed set, so that
/// metrics labelled with it stay bounded however many peers there are.
pub const PEER_TYPES: &[&str] = &["mon", "osd", "mds", "mgr", "client", "other"];

/// Index into [`PEER_TYPES`] of an entity name.
pub fn peer_type(entity: &str) -> usize {
    let kind = entity.split_once('.').map_or(entity, |(k, _)| k);
    PEER_TYPES
        .iter()
        .position(|t| *t == kind)
        .unwrap_or(PEER_TYPES.len() - 1)
}

/// Counters of the connections with one kind of peer ([`PEER_TYPES`]).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct PeerStats {
    /// Bytes written to sockets (frame headers included).
    pub bytes_sent: u64,
    /// Bytes read from sockets (frame headers included).
    pub bytes_received: u64,
    /// Requests, responses and one-way messages sent (keepalives not counted).
    pub messages_sent: u64,
    /// Requests, responses and one-way messages received (keepalives not counted).
    pub messages_received: u64,
    /// Connections open now.
    pub connections_open: u64,
    /// Connections closed, for any reason.
    pub connections_closed: u64,
    /// Connections closed by a fault: a write that failed, a malformed frame, a peer silent
    /// past the keepalive timeout.
    pub connection_errors: u64,
    /// Connections dialled again after the previous one to the same address was lost.
    pub reconnects: u64,
}

impl PeerStats {
    fn add(&mut self, o: &PeerStats) {
        self.bytes_sent += o.bytes_sent;
        self.bytes_received += o.bytes_received;
        self.messages_sent += o.messages_sent;
        self.messages_received += o.messages_received;
        self.connections_open += o.connections_open;
        self.connections_closed += o.connections_closed;
        self.connection_errors += o.connection_errors;
        self.reconnects += o.reconnects;
    }
}

/// A snapshot of a messenger's counters.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct MsgrStats {
    /// Inbound connections that completed the handshake.
    pub connections_accepted: u64,
    /// Outbound connections that completed the handshake.
    pub connections_dialed: u64,
    /// Handshakes that failed for any reason other than authentication (both directions).
    pub handshake_failures: u64,
    /// Handshakes that failed authentication (both directions).
    pub auth_failures: u64,
    /// Connections closed because of a malformed frame.
    pub frame_errors: u64,
    /// Frames written to sockets (keepalives included).
    pub frames_sent: u64,
    /// Socket flushes: each carries one or more frames (a busy connection coalesces the
    /// frames that become ready in one scheduler pass).
    pub flushes: u64,
    /// Dials that failed (no answer, refused, handshake failed), before any retry.
    pub connect_failures: u64,
    /// Traffic and connections by kind of peer, indexed like [`PEER_TYPES`].
    pub by_peer: [PeerStats; PEER_TYPES.len()],
}

impl MsgrStats {
    /// Adds `other`'s counters to these (a process with several messengers reports one sum).
    pub fn add(&mut self, other: &MsgrStats) {
        self.connections_accepted += other.connections_accepted;
        self.connections_dialed += other.connections_dialed;
        self.handshake_failures += other.handshake_failures;
        self.auth_failures += other.auth_failures;
        self.frame_errors += other.frame_errors;
        self.frames_sent += other.frames_sent;
        self.flushes += other.flushes;
        self.connect_failures += other.connect_failures;
        for (a, b) in self.by_peer.iter_mut().zip(&other.by_peer) {
            a.add(b);
        }
    }
}

/// What every task of a messenger shares.
struct Core {
    entity: Arc<str>,
    secret: Option<Secret>,
    keys: Option<Arc<dyn KeyLookup>>,
    dispatcher: Option<Arc<dyn Dispatcher>>,
    config: Arc<MsgrConfig>,
    policy: Option<NetworkPolicy>,
    stats: Arc<Stats>,
    sessions: Mutex<HashMap<u64, Weak<Session>>>,
    next_session_id: AtomicU64,
    shutdown: watch::Sender<bool>,
}

impl Core {
    fn sessions(&self) -> MutexGuard<'_, HashMap<u64, Weak<Session>>> {
        self.sessions.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn is_shut_down(&self) -> bool {
        *self.shutdown.borrow()
    }

    fn start_session(
        &self,
        stream: TcpStream,
        peer_entity: String,
        peer_addr: SocketAddr,
        direction: Direction,
    ) -> Arc<Session> {
        let session = Session::start(
            stream,
            SessionParams {
                id: self.next_session_id.fetch_add(1, Ordering::Relaxed),
                local_entity: self.entity.clone(),
                peer_entity,
                peer_addr,
                direction,
                config: self.config.clone(),
                dispatcher: self.dispatcher.clone(),
                policy: self.policy.clone(),
                stats: self.stats.clone(),
            },
        );
        let mut sessions = self.sessions();
        sessions.retain(|_, w| w.upgrade().is_some_and(|s| !s.is_closed()));
        sessions.insert(session.id, Arc::downgrade(&session));
        drop(sessions);
        // A shutdown that raced with this handshake must not leave the new session running.
        if self.is_shut_down() {
            close_arc(&session, "messenger shut down".to_string());
        }
        session
    }

    fn count_handshake_failure(&self, e: &MsgrError) {
        let counter = match e {
            MsgrError::AuthFailed { .. } => &self.stats.auth_failures,
            _ => &self.stats.handshake_failures,
        };
        counter.fetch_add(1, Ordering::Relaxed);
    }

    async fn handle_inbound(
        self: Arc<Self>,
        mut stream: TcpStream,
        addr: SocketAddr,
        handshake_slot: tokio::sync::OwnedSemaphorePermit,
    ) {
        let _ = stream.set_nodelay(true);
        let Some(keys) = self.keys.clone() else {
            return;
        };
        let peer = addr.to_string();
        let timeout = self.config.handshake_timeout();
        let hs = handshake::server(&mut stream, &self.entity, keys.as_ref(), timeout, &peer).await;
        drop(handshake_slot);
        match hs {
            Ok(entity) => {
                if let Some(policy) = &self.policy
                    && policy.is_partitioned(&self.entity, &entity)
                {
                    debug!(peer = %entity, "inbound connection dropped: partitioned by policy");
                    return;
                }
                self.stats
                    .connections_accepted
                    .fetch_add(1, Ordering::Relaxed);
                self.start_session(stream, entity, addr, Direction::Inbound);
            }
            Err(e) => {
                self.count_handshake_failure(&e);
                match &e {
                    MsgrError::AuthFailed { .. } | MsgrError::VersionMismatch { .. } => {
                        warn!(error = %e, "inbound connection refused")
                    }
                    _ => info!(error = %e, "inbound handshake failed"),
                }
            }
        }
    }

    async fn dial(&self, addr: SocketAddr) -> Result<Arc<Session>> {
        if self.is_shut_down() {
            return Err(MsgrError::Shutdown);
        }
        let secret = self
            .secret
            .clone()
            .ok_or(MsgrError::Config("connect needs a secret (builder.secret)"))?;
        let failed = |reason: String| MsgrError::ConnectFailed { addr, reason };
        if let Some(policy) = &self.policy
            && let Some(peer) = policy.entity_at(addr)
            && policy.is_partitioned(&self.entity, &peer)
        {
            return Err(failed(format!("partitioned from {peer} by network policy")));
        }
        let mut stream =
            tokio::time::timeout(self.config.connect_timeout(), TcpStream::connect(addr))
                .await
                .map_err(|_| {
                    failed(format!(
                        "no answer within {:?}",
                        self.config.connect_timeout()
                    ))
                })?
                .map_err(|e| failed(e.to_string()))?;
        let _ = stream.set_nodelay(true);
        let hs = handshake::client(
            &mut stream,
            &self.entity,
            &secret,
            self.config.handshake_timeout(),
            &addr.to_string(),
        )
        .await;
        let peer_entity = match hs {
            Ok(e) => e,
            Err(e) => {
                self.count_handshake_failure(&e);
                return Err(match e {
                    // Not worth retrying: surface as is.
                    e @ (MsgrError::AuthFailed { .. } | MsgrError::VersionMismatch { .. }) => e,
                    // Resets, EOFs, timeouts and garbage mid-handshake: the connection could
                    // not be established; trying again later is reasonable.
                    other => failed(other.to_string()),
                });
            }
        };
        if let Some(policy) = &self.policy {
            policy.register_addr(addr, &peer_entity);
            if policy.is_partitioned(&self.entity, &peer_entity) {
                return Err(failed(format!(
                    "partitioned from {peer_entity} by network policy"
                )));
            }
        }
        self.stats
            .connections_dialed
            .fetch_add(1, Ordering::Relaxed);
        Ok(self.start_session(stream, peer_entity, addr, Direction::Outbound))
    }

    fn shutdown_all(&self) {
        self.shutdown.send_replace(true);
        let sessions: Vec<Arc<Session>> = self
            .sessions()
            .drain()
            .filter_map(|(_, w)| w.upgrade())
            .collect();
        for s in sessions {
            close_arc(&s, "messenger shut down".to_string());
        }
    }
}

struct MessengerInner {
    core: Arc<Core>,
    conns: Mutex<HashMap<SocketAddr, Connection>>,
}

impl Drop for MessengerInner {
    fn drop(&mut self) {
        self.core.shutdown_all();
    }
}

/// One endpoint of the Kelp network (a daemon or a client): an entity name, its secret, and
/// optionally listening sockets and a [`Dispatcher`].
///
/// Cheap to clone; all clones share connections. Dropping the last clone (or calling
/// [`Messenger::shutdown`]) closes every listener and connection.
///
/// A daemon:
///
/// ```no_run
/// # use std::sync::Arc;
/// # use kelp_msgr::*;
/// # struct Osd;
/// # #[async_trait::async_trait] impl Dispatcher for Osd {}
/// # async fn f(keyring: Keyring, my_secret: Secret) -> Result<(), MsgrError> {
/// let msgr = Messenger::builder("osd.3")
///     .secret(my_secret)                 // to dial others
///     .keys(Arc::new(keyring))           // to authenticate who dials us
///     .dispatcher(Arc::new(Osd))         // answers requests, receives one-way messages
///     .build()?;
/// let addr = msgr.bind("127.0.0.1:0".parse().unwrap()).await?;
/// # Ok(()) }
/// ```
#[derive(Clone)]
pub struct Messenger {
    inner: Arc<MessengerInner>,
}

impl std::fmt::Debug for Messenger {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Messenger({})", self.inner.core.entity)
    }
}

/// Builds a [`Messenger`]; see [`Messenger::builder`].
pub struct MessengerBuilder {
    entity: String,
    secret: Option<Secret>,
    keys: Option<Arc<dyn KeyLookup>>,
    dispatcher: Option<Arc<dyn Dispatcher>>,
    config: MsgrConfig,
    policy: Option<NetworkPolicy>,
}

impl MessengerBuilder {
    /// Our own secret, proven when we dial. Required for [`Messenger::connect`].
    pub fn secret(mut self, secret: Secret) -> Self {
        self.secret = Some(secret);
        self
    }
    /// Where to look up the secrets of entities that dial us. Required for [`Messenger::bind`].
    pub fn keys(mut self, keys: Arc<dyn KeyLookup>) -> Self {
        self.keys = Some(keys);
        self
    }
    /// Handles requests and one-way messages arriving on any of our connections, dialled or
    /// accepted (for a client, this is where server pushes arrive). Without one, requests are
    /// answered with [`crate::code::NO_HANDLER`] and one-way messages are dropped.
    pub fn dispatcher(mut self, dispatcher: Arc<dyn Dispatcher>) -> Self {
        self.dispatcher = Some(dispatcher);
        self
    }
    /// Tunables (default: [`MsgrConfig::default`]).
    pub fn config(mut self, config: MsgrConfig) -> Self {
        self.config = config;
        self
    }
    /// Fault injection (tests): every connection and frame is checked against `policy`.
    pub fn policy(mut self, policy: NetworkPolicy) -> Self {
        self.policy = Some(policy);
        self
    }
    /// Validates the entity name and builds the messenger.
    pub fn build(self) -> Result<Messenger> {
        validate_entity(&self.entity)?;
        if self.config.max_meta_len < 4 {
            return Err(MsgrError::Config(
                "max_meta_len must be at least 4 (an error reply's code must fit)",
            ));
        }
        let (shutdown, _) = watch::channel(false);
        let core = Arc::new(Core {
            entity: Arc::from(self.entity.as_str()),
            secret: self.secret,
            keys: self.keys,
            dispatcher: self.dispatcher,
            config: Arc::new(self.config),
            policy: self.policy,
            stats: Arc::new(Stats::default()),
            sessions: Mutex::new(HashMap::new()),
            next_session_id: AtomicU64::new(1),
            shutdown,
        });
        Ok(Messenger {
            inner: Arc::new(MessengerInner {
                core,
                conns: Mutex::new(HashMap::new()),
            }),
        })
    }
}

impl Messenger {
    /// Starts building a messenger for `entity` (`osd.3`, `client.admin`, `mon.a`, …).
    pub fn builder(entity: impl Into<String>) -> MessengerBuilder {
        MessengerBuilder {
            entity: entity.into(),
            secret: None,
            keys: None,
            dispatcher: None,
            config: MsgrConfig::default(),
            policy: None,
        }
    }

    /// Our entity name.
    pub fn entity(&self) -> &str {
        &self.inner.core.entity
    }

    /// Listens on `addr` (port 0 picks a free port) and returns the bound address. Each
    /// accepted connection is authenticated against the builder's `keys`, then served by its
    /// dispatcher. May be called several times for several addresses.
    pub async fn bind(&self, addr: SocketAddr) -> Result<SocketAddr> {
        let core = self.inner.core.clone();
        if core.keys.is_none() {
            return Err(MsgrError::Config("bind needs a key lookup (builder.keys)"));
        }
        if core.is_shut_down() {
            return Err(MsgrError::Shutdown);
        }
        let listener = TcpListener::bind(addr)
            .await
            .map_err(|source| MsgrError::Bind { addr, source })?;
        let local = listener
            .local_addr()
            .map_err(|source| MsgrError::Bind { addr, source })?;
        if let Some(policy) = &core.policy {
            policy.register_addr(local, &core.entity);
        }
        info!(entity = %core.entity, addr = %local, "messenger listening");
        tokio::spawn(accept_loop(core, listener));
        Ok(local)
    }

    /// The connection to `addr`: the cached one if any (one connection per peer address),
    /// otherwise a new one, dialled and authenticated now so that an unreachable peer or a bad
    /// key is reported here. If the cached connection has died, the next call on it redials.
    pub async fn connect(&self, addr: SocketAddr) -> Result<Connection> {
        let conn = self.connection(addr);
        conn.slot.session().await?;
        Ok(conn)
    }

    /// Like [`connect`](Self::connect) but lazy: returns the cached handle (or a new one)
    /// without dialling; the first call dials.
    pub fn connection(&self, addr: SocketAddr) -> Connection {
        let mut conns = self.inner.conns.lock().unwrap_or_else(|p| p.into_inner());
        conns
            .entry(addr)
            .or_insert_with(|| Connection {
                slot: Arc::new(Slot {
                    core: self.inner.core.clone(),
                    addr,
                    current: Mutex::new(None),
                    dial: tokio::sync::Mutex::new(Backoff::default()),
                }),
            })
            .clone()
    }

    /// Forgets the cached connection to `addr` and closes it (pending calls on it fail with
    /// `ConnectionLost`). For peers that left the cluster; a later `connect` dials afresh.
    pub fn disconnect(&self, addr: SocketAddr) {
        let removed = self
            .inner
            .conns
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .remove(&addr);
        if let Some(conn) = removed
            && let Some(s) = conn.slot.live()
        {
            close_arc(&s, "disconnected locally".to_string());
        }
    }

    /// Every live connection, accepted or dialled (e.g. to push to all subscribers).
    pub fn peers(&self) -> Vec<Peer> {
        self.inner
            .core
            .sessions()
            .values()
            .filter_map(Weak::upgrade)
            .filter(|s| !s.is_closed())
            .map(Peer)
            .collect()
    }

    /// Counters since the messenger was built.
    pub fn stats(&self) -> MsgrStats {
        let s = &self.inner.core.stats;
        MsgrStats {
            connections_accepted: s.connections_accepted.load(Ordering::Relaxed),
            connections_dialed: s.connections_dialed.load(Ordering::Relaxed),
            handshake_failures: s.handshake_failures.load(Ordering::Relaxed),
            auth_failures: s.auth_failures.load(Ordering::Relaxed),
            frame_errors: s.frame_errors.load(Ordering::Relaxed),
            frames_sent: s.frames_sent.load(Ordering::Relaxed),
            flushes: s.flushes.load(Ordering::Relaxed),
            connect_failures: s.connect_failures.load(Ordering::Relaxed),
            by_peer: std::array::from_fn(|i| s.by_peer[i].snapshot()),
        }
    }

    /// Stops listening and closes every connection (pending calls fail with
    /// `ConnectionLost`). Later operations fail with [`MsgrError::Shutdown`].
    pub fn shutdown(&self) {
        self.inner.core.shutdown_all();
    }
}

async fn accept_loop(core: Arc<Core>, listener: TcpListener) {
    let mut shutdown = core.shutdown.subscribe();
    let handshakes = Arc::new(tokio::sync::Semaphore::new(
        core.config.max_pending_handshakes.max(1),
    ));
    loop {
        let accepted = tokio::select! {
            _ = shutdown.wait_for(|s| *s) => break,
            a = listener.accept() => a,
        };
        match accepted {
            Ok((stream, addr)) => {
                let Ok(permit) = handshakes.clone().try_acquire_owned() else {
                    core.stats
                        .handshake_failures
                        .fetch_add(1, Ordering::Relaxed);
                    warn!(%addr, "too many connections in the handshake; refusing this one");
                    continue;
                };
                let core = core.clone();
                tokio::spawn(async move {
                    core.handle_inbound(stream, addr, permit).await;
                });
            }
            Err(e) => {
                // EMFILE and friends: back off instead of spinning.
                warn!(error = %e, "accept failed");
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        }
    }
    debug!(entity = %core.entity, "listener closed");
}

#[derive(Default)]
struct Backoff {
    delay: Option<Duration>,
    next_attempt: Option<Instant>,
}

struct Slot {
    core: Arc<Core>,
    addr: SocketAddr,
    current: Mutex<Option<Arc<Session>>>,
    /// Serialises redials: concurrent callers on a dead connection share one dial.
    dial: tokio::sync::Mutex<Backoff>,
}

impl Slot {
    fn live(&self) -> Option<Arc<Session>> {
        let cur = self.current.lock().unwrap_or_else(|p| p.into_inner());
        cur.as_ref().filter(|s| !s.is_closed()).cloned()
    }

    async fn session(&self) -> Result<Arc<Session>> {
        if let Some(s) = self.live() {
            return Ok(s);
        }
        let mut backoff = self.dial.lock().await;
        if let Some(s) = self.live() {
            return Ok(s);
        }
        if let Some(at) = backoff.next_attempt {
            tokio::time::sleep_until(at).await;
        }
        match self.core.dial(self.addr).await {
            Ok(s) => {
                *backoff = Backoff::default();
                let previous = self
                    .current
                    .lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .replace(s.clone());
                if previous.is_some() {
                    self.core.stats.by_peer[s.peer_type]
                        .reconnects
                        .fetch_add(1, Ordering::Relaxed);
                }
                Ok(s)
            }
            Err(e) => {
                self.core
                    .stats
                    .connect_failures
                    .fetch_add(1, Ordering::Relaxed);
                let cfg = &self.core.config;
                let delay = backoff
                    .delay
                    .map_or(cfg.backoff_min(), |d| (d * 2).min(cfg.backoff_max()));
                backoff.delay = Some(delay);
                backoff.next_attempt = Some(Instant::now() + delay);
                debug!(addr = %self.addr, error = %e, retry_in = ?delay, "dial failed");
                Err(e)
            }
        }
    }

    fn label(&self) -> String {
        match self
            .current
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .as_ref()
        {
            Some(s) => s.label().to_string(),
            None => self.addr.to_string(),
        }
    }
}

/// A client's handle on the connection to one peer address; cheap to clone, shared by all
/// callers (calls are multiplexed by tid). Survives reconnects: when the TCP connection dies,
/// pending calls fail with `ConnectionLost` and the next call dials again (after a doubling
/// backoff if dialling keeps failing).
///
/// ```no_run
/// # use std::time::Duration;
/// # async fn f(msgr: kelp_msgr::Messenger, addr: std::net::SocketAddr) -> Result<(), kelp_msgr::MsgrError> {
/// let conn = msgr.connect(addr).await?;
/// let resp = conn.call(12, &b"meta"[..], &b"data"[..], Duration::from_secs(5)).await?;
/// conn.send(13, &b"fire and forget"[..], bytes::Bytes::new()).await?;
/// # Ok(()) }
/// ```
#[derive(Clone)]
pub struct Connection {
    slot: Arc<Slot>,
}

impl std::fmt::Debug for Connection {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Connection({})", self.slot.label())
    }
}

impl Connection {
    /// The address this connection dials.
    pub fn addr(&self) -> SocketAddr {
        self.slot.addr
    }

    /// The current live connection as a [`Peer`], if there is one.
    pub fn peer(&self) -> Option<Peer> {
        self.slot.live().map(Peer)
    }

    /// Sends a request and waits for its response. `timeout` covers everything, including a
    /// redial. Errors: `Timeout`, `ConnectionLost`, `ConnectFailed` (retryable), `Remote` (the
    /// handler's error), `AuthFailed`, `TooLarge`, `Shutdown`.
    pub async fn call(
        &self,
        msg_type: u16,
        meta: impl Into<Bytes>,
        data: impl Into<Bytes>,
        timeout: Duration,
    ) -> Result<Response> {
        let (meta, data) = (meta.into(), data.into());
        let fut = async {
            let s = self.slot.session().await?;
            s.call(msg_type, meta, data).await
        };
        match tokio::time::timeout(timeout, fut).await {
            Ok(r) => r,
            Err(_) => Err(MsgrError::Timeout {
                peer: self.slot.label(),
                msg_type,
                after: timeout,
            }),
        }
    }

    /// Sends a one-way message (dialling first if needed). Returns once it is queued for the
    /// socket; delivery is not confirmed.
    pub async fn send(
        &self,
        msg_type: u16,
        meta: impl Into<Bytes>,
        data: impl Into<Bytes>,
    ) -> Result<()> {
        let s = self.slot.session().await?;
        s.send(msg_type, meta.into(), data.into()).await
    }
}

/// A ready-made [`Dispatcher`] for clients that only receive one-way messages (pushes): it
/// forwards them, in order, into an mpsc channel, and refuses requests.
///
/// ```no_run
/// # async fn f(secret: kelp_msgr::Secret) -> Result<(), kelp_msgr::MsgrError> {
/// let (dispatcher, mut pushes) = kelp_msgr::ChannelDispatcher::new(64);
/// let msgr = kelp_msgr::Messenger::builder("client.admin")
///     .secret(secret)
///     .dispatcher(dispatcher)
///     .build()?;
/// while let Some(msg) = pushes.recv().await { /* msg.msg_type, msg.meta, msg.data */ }
/// # Ok(()) }
/// ```
pub struct ChannelDispatcher {
    tx: mpsc::Sender<Message>,
}

impl ChannelDispatcher {
    /// A dispatcher and the receiving end of its channel (`capacity` messages buffered; when
    /// full, the connection's reader waits).
    pub fn new(capacity: usize) -> (Arc<Self>, mpsc::Receiver<Message>) {
        let (tx, rx) = mpsc::channel(capacity.max(1));
        (Arc::new(Self { tx }), rx)
    }
}

#[async_trait]
impl Dispatcher for ChannelDispatcher {
    async fn handle_message(&self, msg: Message) {
        if self.tx.send(msg).await.is_err() {
            debug!("push receiver dropped; message discarded");
        }
    }
}
