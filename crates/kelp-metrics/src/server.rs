//! The `/metrics` HTTP endpoint: a small HTTP/1.1 server on its own listener.
//!
//! Each request encodes the registry on its own task: live metrics are atomics and snapshot
//! sources take only short locks, so a scrape never waits on, nor holds up, the data path.
//! `GET /metrics` answers in the Prometheus text format, or in OpenMetrics when the `Accept`
//! header asks for `application/openmetrics-text` (as Prometheus's scraper does).

use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::Arc;

use bytes::Bytes;
use http_body_util::Full;
use hyper::body::Incoming;
use hyper::{Method, Request, Response, StatusCode};
use hyper_util::rt::TokioIo;
use tokio::net::TcpListener;
use tokio::task::JoinHandle;

use crate::{MetricsError, Registry};

const OPENMETRICS: &str = "application/openmetrics-text; version=1.0.0; charset=utf-8";
const PROMETHEUS_TEXT: &str = "text/plain; version=0.0.4; charset=utf-8";

/// A running metrics endpoint; dropping it stops the server.
#[derive(Debug)]
pub struct MetricsServer {
    addr: SocketAddr,
    task: JoinHandle<()>,
}

impl MetricsServer {
    /// The address it listens on (the chosen port when asked for port 0).
    pub fn local_addr(&self) -> SocketAddr {
        self.addr
    }

    /// `http://ADDR/metrics`.
    pub fn url(&self) -> String {
        format!("http://{}/metrics", self.addr)
    }
}

impl Drop for MetricsServer {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// Starts serving `registry` on `addr` (port 0: any free port) on the current tokio runtime.
pub async fn serve(
    addr: SocketAddr,
    registry: Arc<Registry>,
) -> Result<MetricsServer, MetricsError> {
    let listener = TcpListener::bind(addr)
        .await
        .map_err(|source| MetricsError::Bind { addr, source })?;
    let local = listener
        .local_addr()
        .map_err(|source| MetricsError::Bind { addr, source })?;
    let task = tokio::spawn(async move {
        loop {
            let (socket, _) = match listener.accept().await {
                Ok(s) => s,
                Err(e) => {
                    tracing::debug!("metrics endpoint: accept: {e}");
                    tokio::time::sleep(std::time::Duration::from_millis(50)).await;
                    continue;
                }
            };
            let registry = registry.clone();
            tokio::spawn(async move {
                let service = hyper::service::service_fn(move |req| {
                    let registry = registry.clone();
                    async move { Ok::<_, Infallible>(answer(&registry, &req)) }
                });
                let _ = hyper::server::conn::http1::Builder::new()
                    .serve_connection(TokioIo::new(socket), service)
                    .await;
            });
        }
    });
    Ok(MetricsServer { addr: local, task })
}

fn respond(status: StatusCode, content_type: &str, body: String) -> Response<Full<Bytes>> {
    let mut r = Response::new(Full::new(Bytes::from(body)));
    *r.status_mut() = status;
    if let Ok(v) = hyper::header::HeaderValue::from_str(content_type) {
        r.headers_mut().insert(hyper::header::CONTENT_TYPE, v);
    }
    r
}

fn answer(registry: &Registry, req: &Request<Incoming>) -> Response<Full<Bytes>> {
    if req.method() != Method::GET && req.method() != Method::HEAD {
        return respond(
            StatusCode::METHOD_NOT_ALLOWED,
            "text/plain",
            "only GET\n".into(),
        );
    }
    match req.uri().path() {
        "/metrics" => {
            let openmetrics = req
                .headers()
                .get(hyper::header::ACCEPT)
                .and_then(|v| v.to_str().ok())
                .is_some_and(|v| v.contains("application/openmetrics-text"));
            let encoded = if openmetrics {
                registry.encode_openmetrics().map(|b| (OPENMETRICS, b))
            } else {
                registry.encode_prometheus().map(|b| (PROMETHEUS_TEXT, b))
            };
            match encoded {
                Ok((ct, body)) => respond(StatusCode::OK, ct, body),
                Err(e) => respond(
                    StatusCode::INTERNAL_SERVER_ERROR,
                    "text/plain",
                    format!("{e}\n"),
                ),
            }
        }
        "/" => respond(
            StatusCode::OK,
            "text/plain",
            "Kelp daemon metrics: GET /metrics\n".into(),
        ),
        _ => respond(StatusCode::NOT_FOUND, "text/plain", "not found\n".into()),
    }
}
