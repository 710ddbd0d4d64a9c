//! One authenticated connection: a reader task, a writer task, a one-way delivery task, and the
//! table of calls waiting for their responses.
//!
//! Hot path. Both ends of a connection run the same code, so either side can call, answer and
//! send one-way messages (that is how the monitors push maps to subscribers over the
//! subscriber's own connection). Invariants:
//!
//! - tids are allocated per direction; a Response/Error frame is matched only against calls this
//!   end made, so the two directions never collide;
//! - when the session closes, for any reason, every pending call is failed with
//!   `ConnectionLost` at once, and no call can register after that (the `closed` flag is checked
//!   again after registering);
//! - a dropped or timed-out call removes its own entry (a guard), so late responses are ignored
//!   and the table never leaks;
//! - at most `max_in_flight_requests` inbound requests are being handled; the reader stops
//!   reading while at the cap, so TCP flow control pushes back on the peer;
//! - one-way messages are delivered to the dispatcher in arrival order, one at a time, on their
//!   own task, so a slow message handler delays other messages but never responses;
//! - a connection on which nothing arrives for the keepalive timeout, while the reader was free
//!   to read, is closed as dead (each end sends keepalives when configured), so a vanished
//!   peer fails pending calls long before TCP itself would notice.

use std::collections::HashMap;
use std::future::Future;
use std::net::SocketAddr;
use std::panic::AssertUnwindSafe;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::task::{Context, Poll};
use std::time::Duration;

use async_trait::async_trait;
use bytes::Bytes;
use tokio::io::{AsyncWriteExt, BufReader, BufWriter};
use tokio::net::TcpStream;
use tokio::net::tcp::{OwnedReadHalf, OwnedWriteHalf};
use tokio::sync::{Semaphore, mpsc, oneshot, watch};
use tracing::{debug, error, warn};

use crate::code;
use crate::config::MsgrConfig;
use crate::error::{MsgrError, RemoteError, Result};
use crate::frame::{self, Frame, FrameKind, HEADER_LEN};
use crate::messenger::Stats;
use crate::policy::{NetworkPolicy, Verdict};

/// An inbound request, as given to [`Dispatcher::handle_request`].
#[derive(Clone, Debug)]
pub struct Request {
    /// The connection it came on; use it to call back or push later.
    pub peer: Peer,
    pub msg_type: u16,
    pub tid: u64,
    pub meta: Bytes,
    pub data: Bytes,
}

/// The successful answer to a request.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Response {
    pub msg_type: u16,
    pub meta: Bytes,
    pub data: Bytes,
}

impl Response {
    /// A response with the given type and segments.
    pub fn new(msg_type: u16, meta: impl Into<Bytes>, data: impl Into<Bytes>) -> Self {
        Self {
            msg_type,
            meta: meta.into(),
            data: data.into(),
        }
    }
}

/// A one-way message (no answer), as given to [`Dispatcher::handle_message`].
#[derive(Clone, Debug)]
pub struct Message {
    pub peer: Peer,
    pub msg_type: u16,
    pub tid: u64,
    pub meta: Bytes,
    pub data: Bytes,
}

/// The application side of a messenger: answers requests and consumes one-way messages, on
/// every connection (accepted or dialled) of the messenger it is installed in.
///
/// ```
/// use kelp_msgr::{Dispatcher, Request, Response, RemoteError};
/// struct Echo;
/// #[async_trait::async_trait]
/// impl Dispatcher for Echo {
///     async fn handle_request(&self, req: Request) -> Result<Response, RemoteError> {
///         Ok(Response::new(req.msg_type, req.meta, req.data))
///     }
/// }
/// ```
#[async_trait]
pub trait Dispatcher: Send + Sync + 'static {
    /// Answers one request. Runs on its own task, concurrently with other requests of the same
    /// connection (up to `max_in_flight_requests`). A panic is caught and answered with
    /// [`code::HANDLER_PANICKED`]. The default refuses with [`code::NO_HANDLER`].
    async fn handle_request(&self, req: Request) -> Result<Response, RemoteError> {
        Err(RemoteError::new(
            code::NO_HANDLER,
            format!("no handler for msg_type {} on this endpoint", req.msg_type),
        ))
    }

    /// Consumes one one-way message (including server pushes). Messages of one connection
    /// arrive in order, one at a time. The default drops them.
    async fn handle_message(&self, msg: Message) {
        debug!(peer = %msg.peer, msg_type = msg.msg_type, "one-way message dropped: no handler");
    }

    /// Called once when a connection closes (for any reason), e.g. to drop subscriptions.
    fn connection_closed(&self, _peer: &Peer) {}
}

/// Which side opened a connection.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Direction {
    /// We accepted it on a bound address.
    Inbound,
    /// We dialled it with [`crate::Messenger::connect`].
    Outbound,
}

/// A handle on one live (or closed) connection; cheap to clone. Given to handlers with every
/// request and message, and listed by [`crate::Messenger::peers`].
#[derive(Clone)]
pub struct Peer(pub(crate) Arc<Session>);

impl std::fmt::Debug for Peer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Peer({})", self.0.label)
    }
}

impl std::fmt::Display for Peer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0.label)
    }
}

impl Peer {
    /// The authenticated entity at the other end.
    pub fn entity(&self) -> &str {
        &self.0.peer_entity
    }
    /// The socket address of the other end.
    pub fn addr(&self) -> SocketAddr {
        self.0.peer_addr
    }
    /// Whether we accepted or dialled this connection.
    pub fn direction(&self) -> Direction {
        self.0.direction
    }
    /// True once the connection is closed; it never reopens (dial again instead).
    pub fn is_closed(&self) -> bool {
        self.0.is_closed()
    }
    /// Closes the connection; pending calls on it fail with `ConnectionLost`.
    pub fn close(&self) {
        close_arc(&self.0, "closed locally".to_string());
    }
    /// Calls the other end over this connection (it must have a dispatcher).
    pub async fn call(
        &self,
        msg_type: u16,
        meta: impl Into<Bytes>,
        data: impl Into<Bytes>,
        timeout: Duration,
    ) -> Result<Response> {
        let fut = self.0.call(msg_type, meta.into(), data.into());
        match tokio::time::timeout(timeout, fut).await {
            Ok(r) => r,
            Err(_) => Err(MsgrError::Timeout {
                peer: self.0.label.clone(),
                msg_type,
                after: timeout,
            }),
        }
    }
    /// Sends a one-way message (e.g. a pushed map update). Returns once it is queued for the
    /// socket; delivery is not confirmed.
    pub async fn send(
        &self,
        msg_type: u16,
        meta: impl Into<Bytes>,
        data: impl Into<Bytes>,
    ) -> Result<()> {
        self.0.send(msg_type, meta.into(), data.into()).await
    }
}

/// A frame ready for the writer: header (with crc) already computed by the sender's task.
pub(crate) struct Outgoing {
    header: [u8; HEADER_LEN],
    meta: Bytes,
    data: Bytes,
    keepalive: bool,
}

impl Outgoing {
    fn new(kind: FrameKind, msg_type: u16, tid: u64, meta: Bytes, data: Bytes) -> Self {
        Self {
            header: frame::encode_header(kind, msg_type, tid, &meta, &data),
            meta,
            data,
            keepalive: kind == FrameKind::Keepalive,
        }
    }
}

type Pending = HashMap<u64, oneshot::Sender<Result<Response>>>;

/// Everything a session needs from its messenger.
pub(crate) struct SessionParams {
    pub id: u64,
    pub local_entity: Arc<str>,
    pub peer_entity: String,
    pub peer_addr: SocketAddr,
    pub direction: Direction,
    pub config: Arc<MsgrConfig>,
    pub dispatcher: Option<Arc<dyn Dispatcher>>,
    pub policy: Option<NetworkPolicy>,
    pub stats: Arc<Stats>,
}

pub(crate) struct Session {
    pub(crate) id: u64,
    local_entity: Arc<str>,
    peer_entity: String,
    peer_addr: SocketAddr,
    direction: Direction,
    label: String,
    config: Arc<MsgrConfig>,
    dispatcher: Option<Arc<dyn Dispatcher>>,
    policy: Option<NetworkPolicy>,
    stats: Arc<Stats>,
    /// Index into `PEER_TYPES` of the peer's entity, for the per-peer-type counters.
    pub(crate) peer_type: usize,
    out: mpsc::Sender<Outgoing>,
    pending: Mutex<Pending>,
    next_tid: AtomicU64,
    closed: AtomicBool,
    shutdown: watch::Sender<bool>,
    /// When the session started; `last_rx_ms` counts from here.
    born: std::time::Instant,
    /// Milliseconds since `born` at which the last frame (or frame header) arrived.
    last_rx_ms: AtomicU64,
    /// True while the reader is legitimately not reading new frames (waiting for a request
    /// permit or for room in the message queue, or inside a frame body), so silence is not the
    /// peer's fault and the keepalive check must not count it.
    reader_busy: AtomicBool,
    /// Requests of this connection whose handlers are running (replies still to come).
    serving: AtomicUsize,
}

impl Session {
    /// Starts the tasks of an authenticated connection.
    pub(crate) fn start(stream: TcpStream, p: SessionParams) -> Arc<Session> {
        let (rd, wr) = stream.into_split();
        let (out_tx, out_rx) = mpsc::channel(p.config.send_queue_len.max(1));
        let (shutdown, _) = watch::channel(false);
        let session = Arc::new(Session {
            id: p.id,
            label: format!("{}@{}", p.peer_entity, p.peer_addr),
            peer_type: crate::messenger::peer_type(&p.peer_entity),
            local_entity: p.local_entity,
            peer_entity: p.peer_entity,
            peer_addr: p.peer_addr,
            direction: p.direction,
            config: p.config,
            dispatcher: p.dispatcher,
            policy: p.policy,
            stats: p.stats,
            out: out_tx,
            pending: Mutex::new(HashMap::new()),
            next_tid: AtomicU64::new(1),
            closed: AtomicBool::new(false),
            shutdown,
            born: std::time::Instant::now(),
            last_rx_ms: AtomicU64::new(0),
            reader_busy: AtomicBool::new(false),
            serving: AtomicUsize::new(0),
        });
        session
            .counters()
            .connections_open
            .fetch_add(1, Ordering::Relaxed);
        if let Some(policy) = &session.policy {
            policy.register_session(&session);
        }
        let msg_tx = session.dispatcher.clone().map(|d| {
            let (tx, rx) = mpsc::channel(session.config.message_queue_len.max(1));
            tokio::spawn(message_loop(d, rx));
            tx
        });
        if let Some((interval, timeout)) = session.config.keepalive() {
            tokio::spawn(keepalive_loop(session.clone(), interval, timeout));
        }
        tokio::spawn(writer_loop(session.clone(), wr, out_rx));
        tokio::spawn(reader_loop(session.clone(), rd, msg_tx));
        debug!(peer = %session.label, direction = ?session.direction, "connection established");
        session
    }

    pub(crate) fn local_entity(&self) -> &str {
        &self.local_entity
    }
    pub(crate) fn peer_entity(&self) -> &str {
        &self.peer_entity
    }
    pub(crate) fn label(&self) -> &str {
        &self.label
    }
    pub(crate) fn is_closed(&self) -> bool {
        self.closed.load(Ordering::SeqCst)
    }

    /// The counters of this peer's kind.
    fn counters(&self) -> &crate::messenger::PeerCounters {
        &self.stats.by_peer[self.peer_type]
    }

    /// Counts a close caused by a fault (see `PeerStats::connection_errors`).
    fn count_fault(&self) {
        self.counters()
            .connection_errors
            .fetch_add(1, Ordering::Relaxed);
    }

    fn touch_rx(&self) {
        let now = self.born.elapsed().as_millis() as u64;
        self.last_rx_ms.store(now, Ordering::Relaxed);
    }

    fn since_rx(&self) -> Duration {
        let now = self.born.elapsed().as_millis() as u64;
        Duration::from_millis(now.saturating_sub(self.last_rx_ms.load(Ordering::Relaxed)))
    }

    fn pending(&self) -> MutexGuard<'_, Pending> {
        // Every critical section is a single map operation; poisoning cannot break the map.
        self.pending.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn lost(&self, reason: &str) -> MsgrError {
        MsgrError::ConnectionLost {
            peer: self.label.clone(),
            reason: reason.to_string(),
        }
    }

    /// Closes the connection (idempotent): stops the tasks and fails every pending call.
    /// Returns true if this call did the closing. Use [`close_arc`] where an `Arc` is at hand,
    /// so the dispatcher hears about it.
    fn close_inner(&self, reason: String) -> bool {
        if self.closed.swap(true, Ordering::SeqCst) {
            return false;
        }
        self.shutdown.send_replace(true);
        let c = self.counters();
        c.connections_open.fetch_sub(1, Ordering::Relaxed);
        c.connections_closed.fetch_add(1, Ordering::Relaxed);
        let pending = std::mem::take(&mut *self.pending());
        debug!(peer = %self.label, %reason, failed_calls = pending.len(), "connection closed");
        for (_, tx) in pending {
            let _ = tx.send(Err(self.lost(&reason)));
        }
        true
    }

    fn check_sizes(&self, meta: &Bytes, data: &Bytes) -> Result<()> {
        if meta.len() > self.config.max_meta_len as usize {
            return Err(MsgrError::TooLarge {
                segment: "meta",
                len: meta.len(),
                max: self.config.max_meta_len,
            });
        }
        if data.len() > self.config.max_data_len as usize {
            return Err(MsgrError::TooLarge {
                segment: "data",
                len: data.len(),
                max: self.config.max_data_len,
            });
        }
        Ok(())
    }

    /// Issues a request and waits for its response (no deadline here: callers wrap it).
    pub(crate) async fn call(&self, msg_type: u16, meta: Bytes, data: Bytes) -> Result<Response> {
        self.check_sizes(&meta, &data)?;
        if self.is_closed() {
            return Err(self.lost("connection already closed"));
        }
        let tid = self.next_tid.fetch_add(1, Ordering::Relaxed);
        let (tx, rx) = oneshot::channel();
        self.pending().insert(tid, tx);
        let guard = PendingGuard { session: self, tid };
        if self.is_closed() {
            return Err(self.lost("connection closed"));
        }
        let out = Outgoing::new(FrameKind::Request, msg_type, tid, meta, data);
        if self.out.send(out).await.is_err() {
            return Err(self.lost("connection closed"));
        }
        let result = rx.await;
        drop(guard);
        match result {
            Ok(r) => r,
            Err(_) => Err(self.lost("connection closed")),
        }
    }

    /// Queues a one-way message.
    pub(crate) async fn send(&self, msg_type: u16, meta: Bytes, data: Bytes) -> Result<()> {
        self.check_sizes(&meta, &data)?;
        if self.is_closed() {
            return Err(self.lost("connection already closed"));
        }
        let tid = self.next_tid.fetch_add(1, Ordering::Relaxed);
        let out = Outgoing::new(FrameKind::OneWay, msg_type, tid, meta, data);
        self.out
            .send(out)
            .await
            .map_err(|_| self.lost("connection closed"))
    }

    fn complete(&self, f: Frame) {
        let Some(tx) = self.pending().remove(&f.tid) else {
            debug!(peer = %self.label, tid = f.tid, "response for an unknown or abandoned call dropped");
            return;
        };
        let result = if f.kind == FrameKind::ErrorResponse {
            let (code, message) = frame::decode_error_meta(&f.meta);
            Err(MsgrError::Remote {
                peer: self.label.clone(),
                msg_type: f.msg_type,
                error: RemoteError { code, message },
            })
        } else {
            Ok(Response {
                msg_type: f.msg_type,
                meta: f.meta,
                data: f.data,
            })
        };
        let _ = tx.send(result);
    }

    async fn serve_request(self: Arc<Self>, f: Frame) {
        let (msg_type, tid) = (f.msg_type, f.tid);
        let result = match self.dispatcher.clone() {
            None => Err(RemoteError::new(
                code::NO_HANDLER,
                "this endpoint has no dispatcher",
            )),
            Some(d) => {
                let req = Request {
                    peer: Peer(self.clone()),
                    msg_type,
                    tid,
                    meta: f.meta,
                    data: f.data,
                };
                match CatchUnwind(d.handle_request(req)).await {
                    Ok(r) => r,
                    Err(()) => {
                        error!(peer = %self.label, msg_type, tid, "request handler panicked");
                        Err(RemoteError::new(code::HANDLER_PANICKED, "handler panicked"))
                    }
                }
            }
        };
        let out = match result {
            Ok(resp) => match self.check_sizes(&resp.meta, &resp.data) {
                Ok(()) => Outgoing::new(
                    FrameKind::Response,
                    resp.msg_type,
                    tid,
                    resp.meta,
                    resp.data,
                ),
                Err(e) => {
                    warn!(peer = %self.label, msg_type, tid, error = %e, "response too large");
                    error_frame(
                        self.config.max_meta_len,
                        msg_type,
                        tid,
                        code::RESPONSE_TOO_LARGE,
                        &e.to_string(),
                    )
                }
            },
            Err(e) => error_frame(self.config.max_meta_len, msg_type, tid, e.code, &e.message),
        };
        // Counted by the reader when it started this request; done before the reply is
        // queued, so the writer does not wait for more frames on this one's account.
        self.serving.fetch_sub(1, Ordering::Relaxed);
        // Fails only if the connection closed meanwhile; the caller sees ConnectionLost.
        let _ = self.out.send(out).await;
    }
}

/// An error reply. The message is cut (at a character boundary) so the frame always fits the
/// meta limit: an error reply must never itself be refused as oversized.
fn error_frame(max_meta_len: u32, msg_type: u16, tid: u64, code: u32, message: &str) -> Outgoing {
    let room = (max_meta_len as usize).saturating_sub(4);
    let mut cut = message.len().min(room);
    while !message.is_char_boundary(cut) {
        cut -= 1;
    }
    let message = &message[..cut];
    Outgoing::new(
        FrameKind::ErrorResponse,
        msg_type,
        tid,
        frame::encode_error_meta(code, message),
        Bytes::new(),
    )
}

/// Removes a call's pending entry when the call ends or is dropped (timeout, cancellation).
struct PendingGuard<'a> {
    session: &'a Session,
    tid: u64,
}

impl Drop for PendingGuard<'_> {
    fn drop(&mut self) {
        self.session.pending().remove(&self.tid);
    }
}

/// Turns a panic inside a boxed future into `Err(())` so one bad handler cannot take the
/// connection (or the process, with `panic = abort` aside) down with it.
struct CatchUnwind<F>(F);

impl<F: Future + Unpin> Future for CatchUnwind<F> {
    type Output = std::result::Result<F::Output, ()>;
    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let inner = &mut self.0;
        match std::panic::catch_unwind(AssertUnwindSafe(|| Pin::new(inner).poll(cx))) {
            Ok(Poll::Ready(v)) => Poll::Ready(Ok(v)),
            Ok(Poll::Pending) => Poll::Pending,
            Err(_) => Poll::Ready(Err(())),
        }
    }
}

async fn message_loop(dispatcher: Arc<dyn Dispatcher>, mut rx: mpsc::Receiver<Message>) {
    while let Some(msg) = rx.recv().await {
        let (peer, msg_type) = (msg.peer.to_string(), msg.msg_type);
        if CatchUnwind(dispatcher.handle_message(msg)).await.is_err() {
            error!(%peer, msg_type, "message handler panicked");
        }
    }
}

async fn writer_loop(session: Arc<Session>, wr: OwnedWriteHalf, mut rx: mpsc::Receiver<Outgoing>) {
    let mut w = BufWriter::with_capacity(64 * 1024, wr);
    let mut shutdown = session.shutdown.subscribe();
    let result: std::io::Result<()> = async {
        loop {
            let first = tokio::select! {
                biased;
                _ = shutdown.wait_for(|closed| *closed) => return Ok(()),
                m = rx.recv() => match m {
                    Some(m) => m,
                    None => return Ok(()),
                },
            };
            write_one(&session, &mut w, first).await?;
            // Coalesce whatever else is queued into the same flush.
            while let Ok(m) = rx.try_recv() {
                write_one(&session, &mut w, m).await?;
            }
            // With other requests of this connection being served, or other calls waiting for
            // their answers, more frames are likely ready within this scheduler pass: let those
            // tasks run first so that one send carries them all (half the sends per replicated
            // write in a busy cluster). Alone (one call at a time) a yield would only add a
            // scheduler round trip to every frame.
            if session.serving.load(Ordering::Relaxed) > 0 || session.pending().len() > 1 {
                tokio::task::yield_now().await;
                while let Ok(m) = rx.try_recv() {
                    write_one(&session, &mut w, m).await?;
                }
            }
            w.flush().await?;
            session.stats.flushes.fetch_add(1, Ordering::Relaxed);
        }
    }
    .await;
    match result {
        Ok(()) => {
            let _ = w.shutdown().await;
        }
        Err(e) => {
            if !session.is_closed() {
                session.count_fault();
            }
            close_arc(&session, format!("write failed: {e}"))
        }
    }
}

async fn write_one(
    session: &Session,
    w: &mut BufWriter<OwnedWriteHalf>,
    m: Outgoing,
) -> std::io::Result<()> {
    if let Some(policy) = &session.policy {
        match policy.verdict(&session.local_entity, &session.peer_entity) {
            Verdict::Deliver => {}
            Verdict::Drop => return Ok(()),
            Verdict::Delay(d) => {
                w.flush().await?;
                tokio::time::sleep(d).await;
            }
        }
    }
    w.write_all(&m.header).await?;
    w.write_all(&m.meta).await?;
    w.write_all(&m.data).await?;
    session.stats.frames_sent.fetch_add(1, Ordering::Relaxed);
    let c = session.counters();
    c.bytes_sent.fetch_add(
        (HEADER_LEN + m.meta.len() + m.data.len()) as u64,
        Ordering::Relaxed,
    );
    if !m.keepalive {
        c.messages_sent.fetch_add(1, Ordering::Relaxed);
    }
    Ok(())
}

/// Closes through an `Arc`, so the dispatcher's `connection_closed` gets a real `Peer`.
pub(crate) fn close_arc(session: &Arc<Session>, reason: String) {
    if session.close_inner(reason)
        && let Some(d) = &session.dispatcher
    {
        d.connection_closed(&Peer(session.clone()));
    }
}

/// Reads one frame, marking the reader busy while inside a body (a large body may take longer
/// than the keepalive timeout; it has its own deadline).
async fn read_one(
    session: &Session,
    rd: &mut BufReader<OwnedReadHalf>,
    limits: frame::Limits,
    body_timeout: Duration,
) -> std::result::Result<Option<Frame>, crate::error::FrameError> {
    let Some((raw, header)) = frame::read_header(rd, limits).await? else {
        return Ok(None);
    };
    session.touch_rx();
    session.reader_busy.store(true, Ordering::Relaxed);
    let body = frame::read_body(rd, &raw, header, body_timeout).await;
    session.reader_busy.store(false, Ordering::Relaxed);
    body.map(Some)
}

/// Sends a keepalive every `interval` and closes the session when nothing has arrived for
/// `timeout` while the reader was free to read.
async fn keepalive_loop(session: Arc<Session>, interval: Duration, timeout: Duration) {
    let mut shutdown = session.shutdown.subscribe();
    let mut tick = tokio::time::interval(interval);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            _ = shutdown.wait_for(|closed| *closed) => return,
            _ = tick.tick() => {}
        }
        if session.reader_busy.load(Ordering::Relaxed) {
            session.touch_rx();
        } else {
            let idle = session.since_rx();
            if idle > timeout {
                warn!(peer = %session.label, ?idle, "no frame from peer within the keepalive timeout; closing");
                session.count_fault();
                close_arc(
                    &session,
                    format!("nothing received for {idle:?} (keepalive timeout {timeout:?})"),
                );
                return;
            }
        }
        // A full queue means traffic is flowing anyway; skipping this keepalive is fine.
        let ka = Outgoing::new(FrameKind::Keepalive, 0, 0, Bytes::new(), Bytes::new());
        let _ = session.out.try_send(ka);
    }
}

async fn reader_loop(
    session: Arc<Session>,
    rd: OwnedReadHalf,
    msg_tx: Option<mpsc::Sender<Message>>,
) {
    let mut rd = BufReader::with_capacity(64 * 1024, rd);
    let mut shutdown = session.shutdown.subscribe();
    let in_flight = Arc::new(Semaphore::new(session.config.max_in_flight_requests.max(1)));
    let limits = session.config.limits();
    let body_timeout = session.config.frame_body_timeout();
    let reason = loop {
        let read = tokio::select! {
            _ = shutdown.wait_for(|closed| *closed) => break None,
            r = read_one(&session, &mut rd, limits, body_timeout) => r,
        };
        let f = match read {
            Ok(Some(f)) => f,
            Ok(None) => break Some("peer closed the connection".to_string()),
            Err(e) => {
                session.stats.frame_errors.fetch_add(1, Ordering::Relaxed);
                session.count_fault();
                let err = MsgrError::Frame {
                    peer: session.label.clone(),
                    source: e,
                };
                warn!(error = %err, "closing connection");
                break Some(err.to_string());
            }
        };
        if let Some(policy) = &session.policy
            && policy.verdict(&session.local_entity, &session.peer_entity) == Verdict::Drop
        {
            continue;
        }
        session.touch_rx();
        let c = session.counters();
        c.bytes_received.fetch_add(
            (HEADER_LEN + f.meta.len() + f.data.len()) as u64,
            Ordering::Relaxed,
        );
        if f.kind != FrameKind::Keepalive {
            c.messages_received.fetch_add(1, Ordering::Relaxed);
        }
        match f.kind {
            FrameKind::Keepalive => {}
            FrameKind::Response | FrameKind::ErrorResponse => session.complete(f),
            FrameKind::Request => {
                session.reader_busy.store(true, Ordering::Relaxed);
                let permit = tokio::select! {
                    _ = shutdown.wait_for(|closed| *closed) => break None,
                    p = in_flight.clone().acquire_owned() => p,
                };
                session.reader_busy.store(false, Ordering::Relaxed);
                let Ok(permit) = permit else {
                    break Some("request limiter closed".to_string());
                };
                let s = session.clone();
                s.serving.fetch_add(1, Ordering::Relaxed);
                tokio::spawn(async move {
                    s.serve_request(f).await;
                    drop(permit);
                });
            }
            FrameKind::OneWay => {
                let Some(tx) = &msg_tx else {
                    debug!(peer = %session.label, msg_type = f.msg_type, "one-way message dropped: no dispatcher");
                    continue;
                };
                let msg = Message {
                    peer: Peer(session.clone()),
                    msg_type: f.msg_type,
                    tid: f.tid,
                    meta: f.meta,
                    data: f.data,
                };
                session.reader_busy.store(true, Ordering::Relaxed);
                tokio::select! {
                    _ = shutdown.wait_for(|closed| *closed) => break None,
                    r = tx.send(msg) => if r.is_err() {
                        break Some("message delivery task ended".to_string());
                    },
                }
                session.reader_busy.store(false, Ordering::Relaxed);
            }
        }
    };
    if let Some(reason) = reason {
        close_arc(&session, reason);
    }
}
