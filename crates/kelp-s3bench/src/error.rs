//! The one error type of the crate: configuration mistakes, transport failures and S3 error
//! responses, each with what an operator needs to act on it (the endpoint, the S3 error code and
//! message, the object key).

use std::time::Duration;

/// Everything that can go wrong in a benchmark run or in one of its requests.
///
/// Errors of single requests during the timed phase are counted in the report; the setup
/// (bucket creation, preparing objects for `get`) and a run in which every request failed end
/// the run with one of these.
#[derive(Debug, thiserror::Error)]
pub enum BenchError {
    /// No endpoint given on the command line or in `AWS_ENDPOINT_URL`.
    #[error("no S3 endpoint: pass --endpoint http://HOST:PORT or set AWS_ENDPOINT_URL")]
    MissingEndpoint,

    /// An access or secret key is missing.
    #[error("no {which}: pass --{flag} or set {env}")]
    MissingCredential {
        which: &'static str,
        flag: &'static str,
        env: &'static str,
    },

    /// The endpoint is not an `http://host[:port]` URL.
    #[error("bad endpoint '{endpoint}': {reason}")]
    BadEndpoint { endpoint: String, reason: String },

    /// An option has a value the benchmark cannot run with.
    #[error("invalid option --{option}: {reason}")]
    InvalidOption {
        option: &'static str,
        reason: String,
    },

    /// The TCP connection to the endpoint could not be made (refused, unreachable, no such host).
    #[error("cannot connect to {endpoint}: {reason}")]
    Connect { endpoint: String, reason: String },

    /// The connection broke or the response was not valid HTTP.
    #[error("{op} {resource}: HTTP failure talking to {endpoint}: {reason}")]
    Http {
        op: &'static str,
        resource: String,
        endpoint: String,
        reason: String,
    },

    /// The service answered with an S3 error.
    #[error(
        "{op} {resource}: the service answered {status} {code}: {message}{}",
        hint(code)
    )]
    S3 {
        op: &'static str,
        resource: String,
        status: u16,
        /// The S3 error code (`SignatureDoesNotMatch`, `NoSuchBucket`, …), or the HTTP reason
        /// when the response had no S3 error document (e.g. HEAD requests).
        code: String,
        message: String,
    },

    /// A request did not complete within `--timeout`.
    #[error("{op} {resource}: no complete answer within {after:?} (--timeout)")]
    Timeout {
        op: &'static str,
        resource: String,
        after: Duration,
    },

    /// A GET returned a different number of bytes than were written.
    #[error("GetObject {key}: expected {expected} bytes, got {got}")]
    SizeMismatch {
        key: String,
        expected: u64,
        got: u64,
    },

    /// A GET returned other bytes than were written (`--verify`).
    #[error("GetObject {key}: content differs from what was written, first at byte {offset}")]
    ContentMismatch { key: String, offset: u64 },

    /// Setting up the objects for a `get` or `mixed` run failed.
    #[error("preparing {objects} objects for the {mode} run failed: {source}")]
    Prepare {
        mode: &'static str,
        objects: usize,
        #[source]
        source: Box<BenchError>,
    },

    /// Every request of the timed phase failed: there is nothing to report.
    #[error("all {errors} requests failed; the first error was: {first}")]
    AllFailed {
        errors: u64,
        #[source]
        first: Box<BenchError>,
    },

    /// Writing progress or the report to the output failed.
    #[error("cannot write the benchmark output: {0}")]
    Output(#[from] std::io::Error),
}

fn hint(code: &str) -> &'static str {
    match code {
        "SignatureDoesNotMatch" | "InvalidAccessKeyId" | "AccessDenied" | "Forbidden" => {
            " (check --access-key, --secret-key and --region)"
        }
        "AuthorizationHeaderMalformed" => " (check --region)",
        "RequestTimeTooSkewed" => " (this machine's clock is off)",
        _ => "",
    }
}

impl BenchError {
    /// True for failures of one request that another attempt may not see (timeouts, broken
    /// connections, throttling and server-side 5xx); false for configuration and auth problems.
    pub fn is_transient(&self) -> bool {
        match self {
            BenchError::Connect { .. } | BenchError::Http { .. } | BenchError::Timeout { .. } => {
                true
            }
            BenchError::S3 { status, code, .. } => {
                *status >= 500 || code == "SlowDown" || code == "RequestTimeout"
            }
            _ => false,
        }
    }

    /// The S3 error code, if the service answered with one.
    pub fn s3_code(&self) -> Option<&str> {
        match self {
            BenchError::S3 { code, .. } => Some(code),
            BenchError::Prepare { source, .. } => source.s3_code(),
            BenchError::AllFailed { first, .. } => first.s3_code(),
            _ => None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn auth_errors_tell_what_to_check() {
        let e = BenchError::S3 {
            op: "CreateBucket",
            resource: "bench".into(),
            status: 403,
            code: "SignatureDoesNotMatch".into(),
            message: "The request signature we calculated does not match".into(),
        };
        let s = e.to_string();
        assert!(s.contains("403 SignatureDoesNotMatch"), "{s}");
        assert!(s.contains("--secret-key"), "{s}");
        assert!(!e.is_transient());
        assert_eq!(e.s3_code(), Some("SignatureDoesNotMatch"));
    }
}
