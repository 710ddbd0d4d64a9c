//! Accepting connections: the listener loops (TCP and Unix sockets), the connection limit, the
//! handshake timeout and an orderly stop.

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use tokio::io::{AsyncRead, AsyncWrite, BufReader};
use tokio::net::{TcpListener, UnixListener};
use tokio::sync::{Semaphore, watch};
use tokio::task::JoinSet;
use tracing::{debug, info, warn};

use crate::device::Exports;
use crate::handshake::{Outcome, handshake};
use crate::transmission::{Limits, transmit};

/// Server settings. Every field has a default ([`ServerConfig::default`]).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ServerConfig {
    /// Time a client has from connecting to choosing an export (default 10 s); then the
    /// connection is closed.
    pub handshake_timeout: Duration,
    /// Connections served at once over all listeners of this server (default 128); one more
    /// is accepted and closed at once.
    pub max_connections: usize,
    /// Requests of one connection being worked on or waiting for their reply to be written
    /// (default 32); the server reads no further request until one finishes.
    pub max_in_flight_per_conn: usize,
    /// Read and write payload bytes one connection may hold at once (default 64 MiB).
    pub max_in_flight_bytes_per_conn: u32,
    /// The server's own cap on a read or write (default 32 MiB): the advertised maximum block
    /// size is the smaller of this and the device's. Never above
    /// `max_in_flight_bytes_per_conn`.
    pub max_request_bytes: u32,
    /// How long a stop waits for connections to answer their in-flight requests before it
    /// drops them (default 30 s).
    pub shutdown_grace: Duration,
}

impl Default for ServerConfig {
    fn default() -> Self {
        Self {
            handshake_timeout: Duration::from_secs(10),
            max_connections: 128,
            max_in_flight_per_conn: 32,
            max_in_flight_bytes_per_conn: 64 << 20,
            max_request_bytes: 32 << 20,
            shutdown_grace: Duration::from_secs(30),
        }
    }
}

/// The largest payload limit the server will ever advertise (a read's data chunk length must
/// fit in 32 bits with its 8-byte offset; 1 GiB keeps far away from that).
const HARD_MAX_REQUEST: u32 = 1 << 30;

/// An NBD server for a catalogue of exports. One server may serve several listeners at once;
/// the connection limit is shared.
pub struct NbdServer {
    exports: Arc<dyn Exports>,
    cfg: ServerConfig,
    connections: Arc<Semaphore>,
    metrics: Arc<crate::metrics::NbdMetrics>,
}

/// What a connection task needs.
struct Shared {
    metrics: Arc<crate::metrics::NbdMetrics>,
    exports: Arc<dyn Exports>,
    handshake_timeout: Duration,
    server_max: u32,
    limits: Limits,
}

trait Listener {
    type Stream: AsyncRead + AsyncWrite + Send + Unpin + 'static;
    async fn accept_one(&self) -> std::io::Result<(Self::Stream, String)>;
}

impl Listener for TcpListener {
    type Stream = tokio::net::TcpStream;
    async fn accept_one(&self) -> std::io::Result<(Self::Stream, String)> {
        let (s, peer) = self.accept().await?;
        // Replies are written whole; do not hold small ones back.
        s.set_nodelay(true)?;
        Ok((s, peer.to_string()))
    }
}

impl Listener for UnixListener {
    type Stream = tokio::net::UnixStream;
    async fn accept_one(&self) -> std::io::Result<(Self::Stream, String)> {
        let (s, _) = self.accept().await?;
        Ok((s, "unix".to_owned()))
    }
}

impl NbdServer {
    pub fn new(exports: Arc<dyn Exports>, cfg: ServerConfig) -> Self {
        let connections = Arc::new(Semaphore::new(cfg.max_connections.max(1)));
        Self {
            exports,
            cfg,
            connections,
            metrics: Default::default(),
        }
    }

    /// The server's metrics (export them with `NbdMetrics::register`).
    pub fn metrics(&self) -> &crate::metrics::NbdMetrics {
        &self.metrics
    }

    /// The configuration in force.
    pub fn config(&self) -> &ServerConfig {
        &self.cfg
    }

    /// Serves until `shutdown` resolves; then stops accepting and lets connections finish.
    pub async fn serve_tcp(
        &self,
        listener: TcpListener,
        shutdown: impl Future<Output = ()>,
    ) -> std::io::Result<()> {
        if let Ok(addr) = listener.local_addr() {
            info!(%addr, "NBD server listening");
        }
        self.serve(listener, shutdown).await
    }

    /// Serves until `shutdown` resolves; then stops accepting and lets connections finish.
    pub async fn serve_unix(
        &self,
        listener: UnixListener,
        shutdown: impl Future<Output = ()>,
    ) -> std::io::Result<()> {
        if let Ok(addr) = listener.local_addr() {
            info!(addr = ?addr, "NBD server listening");
        }
        self.serve(listener, shutdown).await
    }

    fn shared(&self) -> Arc<Shared> {
        let in_flight_bytes = self.cfg.max_in_flight_bytes_per_conn.max(4096);
        let server_max = self
            .cfg
            .max_request_bytes
            .clamp(1, HARD_MAX_REQUEST)
            .min(in_flight_bytes);
        Arc::new(Shared {
            metrics: self.metrics.clone(),
            exports: self.exports.clone(),
            handshake_timeout: self.cfg.handshake_timeout,
            server_max,
            limits: Limits {
                max_in_flight: self.cfg.max_in_flight_per_conn.max(1),
                max_in_flight_bytes: in_flight_bytes,
            },
        })
    }

    async fn serve<L: Listener>(
        &self,
        listener: L,
        shutdown: impl Future<Output = ()>,
    ) -> std::io::Result<()> {
        let shared = self.shared();
        let (stop_tx, stop_rx) = watch::channel(false);
        let mut conns = JoinSet::new();
        tokio::pin!(shutdown);
        loop {
            tokio::select! {
                () = &mut shutdown => break,
                Some(done) = conns.join_next(), if !conns.is_empty() => {
                    if let Err(e) = done
                        && e.is_panic()
                    {
                        warn!(error = %e, "a connection task panicked");
                    }
                }
                res = listener.accept_one() => match res {
                    Ok((stream, peer)) => {
                        let Ok(permit) = self.connections.clone().try_acquire_owned() else {
                            warn!(%peer, limit = self.cfg.max_connections, "connection limit reached: closing the new connection");
                            continue;
                        };
                        let shared = shared.clone();
                        let stop_rx = stop_rx.clone();
                        conns.spawn(async move {
                            let _open = shared.metrics.connection();
                            serve_connection(stream, &peer, &shared, stop_rx).await;
                            drop(permit);
                        });
                    }
                    Err(e) => {
                        // Out of descriptors and the like: wait a little rather than spin.
                        warn!(error = %e, "accept failed");
                        tokio::time::sleep(Duration::from_millis(100)).await;
                    }
                },
            }
        }
        // Connections learn of the stop before the listener goes away, so a client that finds
        // the port closed knows every open connection has been told.
        let _ = stop_tx.send(true);
        drop(listener);
        let open = conns.len();
        if open > 0 {
            info!(
                connections = open,
                "NBD server stopping: waiting for connections to finish"
            );
        }
        let drained = tokio::time::timeout(self.cfg.shutdown_grace, async {
            while conns.join_next().await.is_some() {}
        })
        .await;
        if drained.is_err() {
            warn!(
                connections = conns.len(),
                "connections still busy after the shutdown grace: dropping them"
            );
            conns.shutdown().await;
        }
        Ok(())
    }
}

async fn serve_connection<S>(stream: S, peer: &str, shared: &Shared, stop_rx: watch::Receiver<bool>)
where
    S: AsyncRead + AsyncWrite + Send + Unpin + 'static,
{
    let (r, mut w) = tokio::io::split(stream);
    let mut r = BufReader::with_capacity(64 << 10, r);
    let hs = tokio::time::timeout(
        shared.handshake_timeout,
        handshake(
            &mut r,
            &mut w,
            &*shared.exports,
            shared.server_max,
            &stop_rx,
        ),
    )
    .await;
    let session = match hs {
        Err(_) => {
            debug!(%peer, "handshake timed out");
            return;
        }
        Ok(Err(e)) => {
            debug!(%peer, error = %e, "handshake failed");
            return;
        }
        Ok(Ok(Outcome::Closed)) => return,
        Ok(Ok(Outcome::Transmission(session))) => session,
    };
    debug!(%peer, export = %session.export, structured = session.negotiated.structured, "transmission");
    if let Err(e) = transmit(&mut r, w, session, shared.limits, stop_rx, &shared.metrics).await {
        debug!(%peer, error = %e, "connection ended");
    }
}
