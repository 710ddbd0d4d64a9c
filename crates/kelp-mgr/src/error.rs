use std::net::SocketAddr;

/// Errors of the manager daemon.
#[derive(Debug, thiserror::Error)]
pub enum MgrError {
    #[error("cannot connect to the cluster: {0}")]
    Connect(#[source] kelp_client::ClientError),
    #[error("cannot listen for the dashboard on {addr}: {source}")]
    Bind {
        addr: SocketAddr,
        #[source]
        source: std::io::Error,
    },
    #[error("cannot write the dashboard address into {path}: {source}")]
    AddrFile {
        path: std::path::PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("invalid manager name '{0}' (letters, digits, '-' and '_', at most 64)")]
    InvalidName(String),
}
