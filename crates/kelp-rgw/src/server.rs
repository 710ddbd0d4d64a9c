//! The HTTP server: accepts connections and hands each request to the front end
//! ([`Front`]: CORS and browser-form handling) in front of the `s3s` service.

use std::future::Future;
use std::net::SocketAddr;
use std::time::Duration;

use hyper_util::rt::{TokioExecutor, TokioIo};
use hyper_util::server::conn::auto::Builder as ConnBuilder;
use s3s::service::S3ServiceBuilder;
use tokio::net::TcpListener;
use tracing::{info, warn};

use crate::front::Front;
use crate::rgw::Rgw;
use crate::s3::{KelpAccess, KelpAuth, KelpS3, MAX_POST_SIZE};

/// Serves S3 on `listener` until `shutdown` resolves, then lets requests in progress finish
/// (up to 30 s). The garbage collector runs alongside.
pub async fn serve(rgw: Rgw, listener: TcpListener, shutdown: impl Future<Output = ()>) {
    let auth = KelpAuth::new(rgw.clone());
    let service = {
        let mut b = S3ServiceBuilder::new(KelpS3::new(rgw.clone(), auth.clone()));
        b.set_auth(auth.clone());
        b.set_access(KelpAccess::new(rgw.clone(), auth.clone()));
        let mut config = s3s::config::S3Config::default();
        config.post_object_max_file_size = MAX_POST_SIZE;
        config.form_max_fields_size = crate::form::MAX_FIELDS_BYTES;
        b.set_config(std::sync::Arc::new(s3s::config::StaticConfigProvider::new(
            std::sync::Arc::new(config),
        )));
        Front::new(b.build(), rgw.clone())
    };
    let gc = tokio::spawn(rgw.clone().run_gc());
    let usage = tokio::spawn(rgw.clone().run_usage());
    let http = ConnBuilder::new(TokioExecutor::new());
    let graceful = hyper_util::server::graceful::GracefulShutdown::new();
    let mut shutdown = std::pin::pin!(shutdown);
    if let Ok(addr) = listener.local_addr() {
        info!("S3 gateway listening on http://{addr}");
    }
    loop {
        let (socket, _peer): (_, SocketAddr) = tokio::select! {
            r = listener.accept() => match r {
                Ok(c) => c,
                Err(e) => {
                    warn!("accept failed: {e}");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                }
            },
            () = shutdown.as_mut() => break,
        };
        let _ = socket.set_nodelay(true);
        let conn = http.serve_connection(TokioIo::new(socket), service.clone());
        let conn = graceful.watch(conn.into_owned());
        tokio::spawn(async move {
            let _ = conn.await;
        });
    }
    gc.abort();
    usage.abort();
    tokio::select! {
        () = graceful.shutdown() => {}
        () = tokio::time::sleep(Duration::from_secs(30)) => {
            warn!("requests still running after 30 s; stopping anyway");
        }
    }
}
