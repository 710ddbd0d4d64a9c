//! A minimal S3 client: the five calls the benchmark makes, path-style, signed with SigV4.
//!
//! Hot path: `put_object` and `get_object` run once per benchmark request. Bodies are `Bytes`
//! (a reference-counted view of the one random buffer), so a 32 MiB PUT copies nothing on our
//! side; the payload's SHA-256 is computed once per buffer (`Payload::new`), as boto3 would
//! compute it per request, so the signed-payload mode costs the client nothing per request.
//! GET bodies are consumed frame by frame and never collected.

use std::time::SystemTime;

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper::{Method, Request, Response, StatusCode, Uri};
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;

use crate::error::BenchError;
use crate::sigv4::{self, EMPTY_SHA256, Signer};

/// A request body together with its SHA-256, computed once.
#[derive(Debug, Clone)]
pub struct Payload {
    pub data: Bytes,
    pub sha256: String,
}

impl Payload {
    pub fn new(data: Bytes) -> Self {
        let sha256 = sigv4::sha256_hex(&data);
        Payload { data, sha256 }
    }

    /// `len` pseudo-random bytes (xorshift64*, seeded from `seed`): incompressible enough that
    /// a service that compresses or deduplicates gains nothing, and cheap to make even at
    /// 32 MiB.
    pub fn random(len: usize, seed: u64) -> Self {
        let mut state = seed | 1;
        let mut buf = Vec::with_capacity(len + 8);
        while buf.len() < len {
            state ^= state >> 12;
            state ^= state << 25;
            state ^= state >> 27;
            buf.extend_from_slice(&state.wrapping_mul(0x2545_F491_4F6C_DD1D).to_le_bytes());
        }
        buf.truncate(len);
        Payload::new(Bytes::from(buf))
    }
}

/// Where the service is: `http://host[:port]`, as the URI prefix and the signed `Host` value.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Endpoint {
    /// `http://authority`, without a trailing slash.
    pub base: String,
    /// The `Host` header: the authority, without `:80`.
    pub host: String,
}

impl Endpoint {
    pub fn parse(endpoint: &str) -> Result<Self, BenchError> {
        let bad = |reason: &str| BenchError::BadEndpoint {
            endpoint: endpoint.to_string(),
            reason: reason.to_string(),
        };
        let uri: Uri = endpoint
            .trim()
            .parse()
            .map_err(|e: hyper::http::uri::InvalidUri| bad(&e.to_string()))?;
        match uri.scheme_str() {
            Some("http") => {}
            Some("https") => {
                return Err(bad(
                    "https is not supported by this load generator (no TLS in the client); use \
                     the service's plain-HTTP port or a local TLS-terminating proxy",
                ));
            }
            Some(other) => return Err(bad(&format!("scheme '{other}' is not http"))),
            None => {
                return Err(bad(
                    "no scheme: expected a URL such as http://127.0.0.1:7480",
                ));
            }
        }
        let authority = uri.authority().ok_or_else(|| bad("the URL has no host"))?;
        if authority.as_str().contains('@') {
            return Err(bad(
                "credentials belong in --access-key/--secret-key, not in the URL",
            ));
        }
        if !matches!(uri.path(), "" | "/") || uri.query().is_some() {
            return Err(bad(
                "the URL must name only the service (http://HOST:PORT), not a bucket or path",
            ));
        }
        let host = match authority.port_u16() {
            Some(80) => authority.host().to_string(),
            _ => authority.as_str().to_string(),
        };
        Ok(Endpoint {
            base: format!("http://{}", authority.as_str()),
            host,
        })
    }
}

/// An S3 client for one endpoint and one set of credentials.
pub struct S3Client {
    http: Client<HttpConnector, Full<Bytes>>,
    endpoint: Endpoint,
    signer: Signer,
    region: String,
}

/// The largest error document we read; S3 error bodies are a few hundred bytes.
const MAX_ERROR_BODY: usize = 64 << 10;

impl S3Client {
    /// A client keeping up to `connections` idle connections to the endpoint.
    pub fn new(
        endpoint: Endpoint,
        access_key: &str,
        secret_key: &str,
        region: &str,
        connections: usize,
    ) -> Self {
        let mut connector = HttpConnector::new();
        connector.set_nodelay(true);
        connector.set_connect_timeout(Some(std::time::Duration::from_secs(10)));
        let http = Client::builder(TokioExecutor::new())
            .pool_max_idle_per_host(connections)
            .build(connector);
        S3Client {
            http,
            endpoint,
            signer: Signer::new(access_key, secret_key, region, "s3"),
            region: region.to_string(),
        }
    }

    /// Signs and sends one request; `path` is already percent-encoded.
    async fn send(
        &self,
        op: &'static str,
        resource: &str,
        method: Method,
        path: &str,
        body: Bytes,
        payload_hash: &str,
    ) -> Result<Response<Incoming>, BenchError> {
        let amz_date = sigv4::amz_date(SystemTime::now());
        // The benchmark's requests carry no query parameters.
        let canonical_query = sigv4::canonical_query(&[]);
        let authorization = self.signer.authorization(&sigv4::Request {
            method: method.as_str(),
            canonical_uri: path,
            canonical_query: &canonical_query,
            headers: &[
                ("host", &self.endpoint.host),
                ("x-amz-content-sha256", payload_hash),
                ("x-amz-date", &amz_date),
            ],
            payload_hash,
            amz_date: &amz_date,
        });
        let mut builder = Request::builder()
            .method(method.clone())
            .uri(format!("{}{}", self.endpoint.base, path))
            .header("host", &self.endpoint.host)
            .header("x-amz-content-sha256", payload_hash)
            .header("x-amz-date", &amz_date)
            .header("authorization", authorization);
        // S3 answers 411 MissingContentLength to a PUT without one, even an empty PUT.
        if method == Method::PUT || !body.is_empty() {
            builder = builder.header("content-length", body.len());
        }
        if !body.is_empty() {
            builder = builder.header("content-type", "application/octet-stream");
        }
        let req = builder
            .body(Full::new(body))
            .map_err(|e| self.http_error(op, resource, e.to_string()))?;
        self.http.request(req).await.map_err(|e| {
            if e.is_connect() {
                BenchError::Connect {
                    endpoint: self.endpoint.base.clone(),
                    reason: root_cause(&e),
                }
            } else {
                self.http_error(op, resource, root_cause(&e))
            }
        })
    }

    fn http_error(&self, op: &'static str, resource: &str, reason: String) -> BenchError {
        BenchError::Http {
            op,
            resource: resource.to_string(),
            endpoint: self.endpoint.base.clone(),
            reason,
        }
    }

    /// Turns a non-success response into `BenchError::S3`, reading the error document.
    async fn s3_error(
        &self,
        op: &'static str,
        resource: &str,
        resp: Response<Incoming>,
    ) -> BenchError {
        let status = resp.status();
        let body = match http_body_util::Limited::new(resp.into_body(), MAX_ERROR_BODY)
            .collect()
            .await
        {
            Ok(b) => b.to_bytes(),
            Err(_) => Bytes::new(),
        };
        let text = String::from_utf8_lossy(&body);
        let code = xml_field(&text, "Code").unwrap_or_else(|| {
            status
                .canonical_reason()
                .unwrap_or("Error")
                .replace(' ', "")
        });
        let message = xml_field(&text, "Message").unwrap_or_else(|| {
            if text.trim().is_empty() {
                "(no error document)".to_string()
            } else if text.contains("<Code>") {
                "(no message)".to_string()
            } else {
                plain_text(&text, 160)
            }
        });
        BenchError::S3 {
            op,
            resource: resource.to_string(),
            status: status.as_u16(),
            code,
            message,
        }
    }

    fn object_path(bucket: &str, key: &str) -> String {
        format!(
            "/{}/{}",
            sigv4::uri_encode(bucket, true),
            sigv4::uri_encode(key, false)
        )
    }

    /// Creates `bucket`; succeeds if the caller already owns it.
    pub async fn create_bucket(&self, bucket: &str) -> Result<(), BenchError> {
        const OP: &str = "CreateBucket";
        // Outside us-east-1 S3 wants the region as the bucket's location constraint.
        let body = if self.region == "us-east-1" {
            Bytes::new()
        } else {
            Bytes::from(format!(
                "<CreateBucketConfiguration xmlns=\"http://s3.amazonaws.com/doc/2006-03-01/\">\
                 <LocationConstraint>{}</LocationConstraint></CreateBucketConfiguration>",
                self.region
            ))
        };
        let hash = if body.is_empty() {
            EMPTY_SHA256.to_string()
        } else {
            sigv4::sha256_hex(&body)
        };
        let path = format!("/{}", sigv4::uri_encode(bucket, true));
        let resp = self
            .send(OP, bucket, Method::PUT, &path, body, &hash)
            .await?;
        if resp.status().is_success() {
            drain(resp).await;
            return Ok(());
        }
        match self.s3_error(OP, bucket, resp).await {
            BenchError::S3 { code, .. } if code == "BucketAlreadyOwnedByYou" => Ok(()),
            // Some services (s3s, older RGW set-ups) say BucketAlreadyExists to the owner too;
            // the bucket is usable if we may read it.
            e @ BenchError::S3 { .. } if e.s3_code() == Some("BucketAlreadyExists") => {
                match self.head_bucket(bucket).await {
                    Ok(()) => Ok(()),
                    Err(_) => Err(e),
                }
            }
            e => Err(e),
        }
    }

    /// Succeeds if `bucket` exists and these credentials may use it.
    pub async fn head_bucket(&self, bucket: &str) -> Result<(), BenchError> {
        const OP: &str = "HeadBucket";
        let path = format!("/{}", sigv4::uri_encode(bucket, true));
        let resp = self
            .send(OP, bucket, Method::HEAD, &path, Bytes::new(), EMPTY_SHA256)
            .await?;
        if resp.status().is_success() {
            drain(resp).await;
            Ok(())
        } else {
            Err(self.s3_error(OP, bucket, resp).await)
        }
    }

    /// Uploads `payload` as `bucket/key`.
    pub async fn put_object(
        &self,
        bucket: &str,
        key: &str,
        payload: &Payload,
    ) -> Result<(), BenchError> {
        const OP: &str = "PutObject";
        let path = Self::object_path(bucket, key);
        let resp = self
            .send(
                OP,
                key,
                Method::PUT,
                &path,
                payload.data.clone(),
                &payload.sha256,
            )
            .await?;
        if resp.status().is_success() {
            drain(resp).await;
            Ok(())
        } else {
            Err(self.s3_error(OP, key, resp).await)
        }
    }

    /// Downloads `bucket/key` and checks that it is as long as `expected` (and, with `verify`,
    /// equal to it). Returns the number of bytes received.
    pub async fn get_object(
        &self,
        bucket: &str,
        key: &str,
        expected: &Bytes,
        verify: bool,
    ) -> Result<u64, BenchError> {
        const OP: &str = "GetObject";
        let path = Self::object_path(bucket, key);
        let resp = self
            .send(OP, key, Method::GET, &path, Bytes::new(), EMPTY_SHA256)
            .await?;
        if !resp.status().is_success() {
            return Err(self.s3_error(OP, key, resp).await);
        }
        let mut body = resp.into_body();
        let mut got: u64 = 0;
        let mut mismatch: Option<u64> = None;
        while let Some(frame) = body.frame().await {
            let frame = frame.map_err(|e| self.http_error(OP, key, root_cause(&e)))?;
            let Ok(data) = frame.into_data() else {
                continue;
            };
            if verify && mismatch.is_none() {
                mismatch = first_difference(expected, got as usize, &data).map(|i| got + i as u64);
            }
            got += data.len() as u64;
        }
        if got != expected.len() as u64 {
            return Err(BenchError::SizeMismatch {
                key: key.to_string(),
                expected: expected.len() as u64,
                got,
            });
        }
        if let Some(offset) = mismatch {
            return Err(BenchError::ContentMismatch {
                key: key.to_string(),
                offset,
            });
        }
        Ok(got)
    }

    /// Deletes `bucket/key` (S3 answers success for a key that does not exist).
    pub async fn delete_object(&self, bucket: &str, key: &str) -> Result<(), BenchError> {
        const OP: &str = "DeleteObject";
        let path = Self::object_path(bucket, key);
        let resp = self
            .send(OP, key, Method::DELETE, &path, Bytes::new(), EMPTY_SHA256)
            .await?;
        if resp.status().is_success() || resp.status() == StatusCode::NOT_FOUND {
            drain(resp).await;
            Ok(())
        } else {
            Err(self.s3_error(OP, key, resp).await)
        }
    }
}

/// Reads a response body to its end so that the connection goes back to the pool.
async fn drain(resp: Response<Incoming>) {
    let mut body = resp.into_body();
    while let Some(Ok(_)) = body.frame().await {}
}

/// The offset within `data` of the first byte that differs from `expected[at..]` (bytes past the
/// end of `expected` differ; the size check reports those).
fn first_difference(expected: &[u8], at: usize, data: &[u8]) -> Option<usize> {
    let want = expected.get(at..).unwrap_or(&[]);
    let n = want.len().min(data.len());
    if want[..n] == data[..n] {
        return (data.len() > n).then_some(n);
    }
    want[..n].iter().zip(&data[..n]).position(|(a, b)| a != b)
}

/// The innermost cause of an error: "Connection refused (os error 111)" rather than hyper's
/// "client error (Connect)".
fn root_cause(e: &(dyn std::error::Error + 'static)) -> String {
    let mut cur = e;
    while let Some(next) = cur.source() {
        cur = next;
    }
    cur.to_string()
}

/// A non-S3 error body (an HTML page from a proxy, a stack trace) as one short line: tags
/// dropped, whitespace collapsed, at most `max` characters.
fn plain_text(body: &str, max: usize) -> String {
    let mut text = String::with_capacity(body.len().min(4 * max));
    let mut in_tag = false;
    for c in body.chars() {
        match c {
            '<' => in_tag = true,
            '>' if in_tag => {
                in_tag = false;
                text.push(' ');
            }
            _ if !in_tag => text.push(c),
            _ => {}
        }
    }
    let words = text.split_whitespace().collect::<Vec<_>>().join(" ");
    if words.chars().count() > max {
        let cut: String = words.chars().take(max).collect();
        format!("{cut}…")
    } else {
        words
    }
}

/// The text of the first `<tag>…</tag>` in an S3 error document, entities decoded.
fn xml_field(doc: &str, tag: &str) -> Option<String> {
    let open = format!("<{tag}>");
    let close = format!("</{tag}>");
    let start = doc.find(&open)? + open.len();
    let end = start + doc[start..].find(&close)?;
    let raw = &doc[start..end];
    Some(
        raw.replace("&lt;", "<")
            .replace("&gt;", ">")
            .replace("&quot;", "\"")
            .replace("&apos;", "'")
            .replace("&amp;", "&"),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn endpoints_parse_or_say_why_not() {
        let e = Endpoint::parse("http://127.0.0.1:7480").unwrap();
        assert_eq!(e.base, "http://127.0.0.1:7480");
        assert_eq!(e.host, "127.0.0.1:7480");
        let e = Endpoint::parse("http://localhost:80/").unwrap();
        assert_eq!(e.host, "localhost");
        for (bad, why) in [
            ("https://s3.amazonaws.com", "https"),
            ("127.0.0.1:7480", "scheme"),
            ("ftp://h", "scheme"),
            ("http://127.0.0.1:7480/bucket", "bucket"),
            ("http://ak:sk@h:1", "credentials"),
            ("http://[::1", ""),
        ] {
            let err = Endpoint::parse(bad).unwrap_err();
            assert!(
                matches!(err, BenchError::BadEndpoint { .. }),
                "{bad}: {err}"
            );
            assert!(err.to_string().contains(why), "{bad}: {err}");
        }
    }

    #[test]
    fn error_documents_yield_code_and_message() {
        let doc = "<?xml version=\"1.0\"?><Error><Code>NoSuchKey</Code>\
                   <Message>The key &quot;a&amp;b&quot; does not exist</Message></Error>";
        assert_eq!(xml_field(doc, "Code").as_deref(), Some("NoSuchKey"));
        assert_eq!(
            xml_field(doc, "Message").as_deref(),
            Some("The key \"a&b\" does not exist")
        );
        assert_eq!(xml_field(doc, "RequestId"), None);
    }

    #[test]
    fn other_error_bodies_become_one_short_line() {
        let page = "<!doctype html>\n<html lang=en>\n<title>500 Internal Server Error</title>\n\
                    <h1>Internal Server Error</h1>\n<p>The server encountered an error.</p>";
        assert_eq!(
            plain_text(page, 200),
            "500 Internal Server Error Internal Server Error The server encountered an error."
        );
        assert_eq!(plain_text("abcdef", 3), "abc…");
    }

    #[test]
    fn payloads_are_random_and_hashed_once() {
        let p = Payload::random(1000, 7);
        assert_eq!(p.data.len(), 1000);
        assert_eq!(p.sha256, sigv4::sha256_hex(&p.data));
        assert_ne!(p.data, Payload::random(1000, 8).data);
        // Not a repeating pattern: no two 8-byte words of the first 1000 bytes are equal.
        let words: std::collections::HashSet<&[u8]> = p.data.chunks(8).collect();
        assert_eq!(words.len(), 125);
    }

    #[test]
    fn differences_are_located() {
        let want = b"abcdef";
        assert_eq!(first_difference(want, 0, b"abc"), None);
        assert_eq!(first_difference(want, 3, b"def"), None);
        assert_eq!(first_difference(want, 2, b"cdX"), Some(2));
        assert_eq!(first_difference(want, 4, b"efg"), Some(2));
        assert_eq!(first_difference(want, 9, b"z"), Some(0));
    }
}
