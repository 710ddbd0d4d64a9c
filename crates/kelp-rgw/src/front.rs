//! The HTTP front end in front of the `s3s` service: what S3 does at the HTTP level and `s3s`
//! does not.
//!
//! * **CORS.** `s3s` does not route `OPTIONS`: a browser's preflight is answered here from the
//!   bucket's CORS rules (200 with the Access-Control-Allow-* headers, 403 `AccessForbidden`
//!   when no rule matches or the bucket has none). Any other request carrying an `Origin`
//!   gets the headers of the first matching rule added to its answer (one read of the bucket
//!   record; requests without `Origin` cost nothing).
//! * **Browser POST uploads.** The body of a `multipart/form-data` POST to a bucket streams
//!   through a [`FormSniffer`] (the form's `acl` field and file name, see [`crate::form`]).
//!   On the way out, a policy condition that failed is reported as S3 does (403
//!   `AccessDenied`, "Invalid according to Policy", where `s3s` says 400
//!   `InvalidPolicyDocument`), and a `key` with `${filename}` is shown as stored in the 201
//!   document and the 303 redirect (`s3s` writes the key as the form gave it).
//! * **Request documents.** The checksum of an XML request body (and the elements of a
//!   lifecycle configuration) is checked as `s3s` reads it ([`DocumentCheck`]); a refusal
//!   replaces `s3s`' answer.

use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex};

use bytes::Bytes;
use hyper::body::Incoming;
use hyper::header::{HeaderMap, HeaderName, HeaderValue};
use hyper::{Method, Request, Response, StatusCode};
use s3s::service::S3Service;
use s3s::{Body, HttpError};

use crate::RgwError;
use crate::cors;
use crate::form::{FormFields, FormSniffer, PostForm, form_boundary};
use crate::rgw::Rgw;
use crate::unsupported;

/// The gateway's HTTP service: the `s3s` service plus CORS and form handling.
#[derive(Clone)]
pub struct Front {
    s3: S3Service,
    rgw: Rgw,
}

impl Front {
    pub fn new(s3: S3Service, rgw: Rgw) -> Front {
        Front { s3, rgw }
    }
}

type BoxFuture<T> = Pin<Box<dyn Future<Output = T> + Send>>;

impl hyper::service::Service<Request<Incoming>> for Front {
    type Response = Response<Body>;
    type Error = HttpError;
    type Future = BoxFuture<Result<Response<Body>, HttpError>>;

    fn call(&self, req: Request<Incoming>) -> Self::Future {
        let this = self.clone();
        let op = crate::metrics::s3_operation(
            req.method().as_str(),
            req.uri().path(),
            req.uri().query().unwrap_or(""),
            req.headers().contains_key("x-amz-copy-source"),
        );
        let bucket = target(req.uri().path()).0;
        let bytes_in = content_length(req.headers());
        let guard = this.rgw.metrics().start();
        Box::pin(async move {
            let r = this.handle(req).await;
            let (status, bytes_out) = match &r {
                Ok(resp) => (resp.status().as_u16(), content_length(resp.headers())),
                Err(_) => (500, 0),
            };
            guard.done(op, bucket.as_deref(), status, bytes_in, bytes_out);
            r
        })
    }
}

/// The bucket and key of a path-style request (`/bucket/key`).
fn target(path: &str) -> (Option<String>, bool) {
    let path = path.strip_prefix('/').unwrap_or(path);
    let (bucket, key) = path.split_once('/').unwrap_or((path, ""));
    if bucket.is_empty() {
        return (None, false);
    }
    let bucket = percent_encoding::percent_decode_str(bucket)
        .decode_utf8_lossy()
        .into_owned();
    (Some(bucket), !key.is_empty())
}

/// The Content-Length a message announces (0 when none).
fn content_length(h: &HeaderMap) -> u64 {
    h.get(hyper::header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse().ok())
        .unwrap_or(0)
}

fn header<'a>(h: &'a HeaderMap, name: &str) -> Option<&'a str> {
    h.get(name).and_then(|v| v.to_str().ok())
}

fn xml_escape(s: &str) -> String {
    s.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
        .replace('"', "&quot;")
        .replace('\'', "&apos;")
}

fn xml_unescape(s: &str) -> String {
    s.replace("&lt;", "<")
        .replace("&gt;", ">")
        .replace("&quot;", "\"")
        .replace("&apos;", "'")
        .replace("&amp;", "&")
}

/// An S3 error document.
fn error_response(status: StatusCode, code: &str, message: &str) -> Response<Body> {
    let xml = format!(
        "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n<Error><Code>{}</Code><Message>{}</Message></Error>",
        xml_escape(code),
        xml_escape(message)
    );
    let mut resp = Response::new(Body::from(xml));
    *resp.status_mut() = status;
    resp.headers_mut().insert(
        hyper::header::CONTENT_TYPE,
        HeaderValue::from_static("application/xml"),
    );
    resp
}

/// `application/x-www-form-urlencoded` as the `url` crate writes query pairs.
fn form_urlencode(s: &str) -> String {
    let mut out = String::new();
    for b in s.bytes() {
        match b {
            b'a'..=b'z' | b'A'..=b'Z' | b'0'..=b'9' | b'*' | b'-' | b'.' | b'_' => {
                out.push(b as char)
            }
            b' ' => out.push('+'),
            b => out.push_str(&format!("%{b:02X}")),
        }
    }
    out
}

/// The text of an element of a small XML document.
fn xml_element<'a>(xml: &'a str, name: &str) -> Option<&'a str> {
    let open = format!("<{name}>");
    let start = xml.find(&open)? + open.len();
    let end = xml[start..].find(&format!("</{name}>"))? + start;
    Some(&xml[start..end])
}

impl Front {
    async fn handle(self, req: Request<Incoming>) -> Result<Response<Body>, HttpError> {
        let (mut parts, body) = req.into_parts();
        let (bucket, has_key) = target(parts.uri.path());
        if parts.method == Method::OPTIONS {
            return Ok(self.preflight(bucket, has_key, &parts.headers).await);
        }
        let origin = header(&parts.headers, "origin").map(str::to_string);
        let method = parts.method.clone();
        let mut body = Body::from(body);
        let verdict = DocumentVerdict::default();
        if let Some((checks, lifecycle)) =
            DocumentCheck::for_request(&parts, bucket.as_deref(), has_key)
        {
            body = Body::http_body(DocumentCheck {
                inner: body,
                seen: Vec::new(),
                checks,
                lifecycle,
                verdict: verdict.clone(),
                judged: false,
            });
        }
        let mut form = None;
        if method == Method::POST
            && bucket.is_some()
            && !has_key
            && let Some(boundary) = header(&parts.headers, "content-type").and_then(form_boundary)
        {
            let pf = PostForm::default();
            parts.extensions.insert(pf.clone());
            body = Body::http_body(FormSniffer::new(body, &boundary, pf.clone()));
            form = Some(pf);
        }
        let mut resp = self.s3.call(Request::from_parts(parts, body)).await?;
        if let Some((status, code, message)) = verdict.take() {
            resp = error_response(status, &code, &message);
        }
        if let Some(pf) = form {
            resp = post_answer(resp, &pf.snapshot()).await;
        }
        if let (Some(origin), Some(bucket)) = (origin, bucket) {
            self.add_cors(&bucket, &origin, &method, resp.headers_mut())
                .await;
        }
        Ok(resp)
    }

    /// Answers a CORS preflight (`OPTIONS`) from the bucket's rules.
    async fn preflight(
        &self,
        bucket: Option<String>,
        has_key: bool,
        h: &HeaderMap,
    ) -> Response<Body> {
        let resource = if has_key { "OBJECT" } else { "BUCKET" };
        let Some(bucket) = bucket else {
            return error_response(
                StatusCode::BAD_REQUEST,
                "InvalidRequest",
                "a CORS preflight names a bucket",
            );
        };
        let Some(origin) = header(h, "origin") else {
            return error_response(
                StatusCode::BAD_REQUEST,
                "BadRequest",
                "Insufficient information. Origin request header needed.",
            );
        };
        let Some(method) = header(h, "access-control-request-method") else {
            return error_response(
                StatusCode::BAD_REQUEST,
                "BadRequest",
                "Invalid Access-Control-Request-Method: null",
            );
        };
        let requested =
            cors::parse_request_headers(header(h, "access-control-request-headers").unwrap_or(""));
        let b = match self.rgw.bucket_cached(&bucket).await {
            Ok(b) => b,
            Err(RgwError::NoSuchBucket(_)) => {
                return error_response(
                    StatusCode::NOT_FOUND,
                    "NoSuchBucket",
                    "The specified bucket does not exist",
                );
            }
            Err(e) => {
                return error_response(
                    StatusCode::SERVICE_UNAVAILABLE,
                    "ServiceUnavailable",
                    &e.to_string(),
                );
            }
        };
        if b.cors.is_empty() {
            return error_response(
                StatusCode::FORBIDDEN,
                "AccessForbidden",
                &format!("CORSResponse: CORS is not enabled for this bucket ({resource})."),
            );
        }
        let Some(m) = cors::find(&b.cors, origin, method, &requested) else {
            return error_response(
                StatusCode::FORBIDDEN,
                "AccessForbidden",
                &format!(
                    "CORSResponse: This CORS request is not allowed. This is usually because \
                     the evaluation of Origin, request method / Access-Control-Request-Method \
                     or Access-Control-Request-Headers are not whitelisted by the resource's \
                     CORS spec ({resource})."
                ),
            );
        };
        let mut resp = Response::new(Body::empty());
        let hs = resp.headers_mut();
        for (name, value) in m.headers() {
            if let Ok(v) = HeaderValue::from_str(&value) {
                hs.insert(name, v);
            }
        }
        if !requested.is_empty()
            && let Ok(v) = HeaderValue::from_str(&requested.join(", "))
        {
            hs.insert("access-control-allow-headers", v);
        }
        hs.insert(
            hyper::header::VARY,
            HeaderValue::from_static(
                "Origin, Access-Control-Request-Headers, Access-Control-Request-Method",
            ),
        );
        resp
    }

    /// Adds the CORS headers of the rule matching an actual request, if one does.
    async fn add_cors(&self, bucket: &str, origin: &str, method: &Method, hs: &mut HeaderMap) {
        let Ok(b) = self.rgw.bucket_cached(bucket).await else {
            return;
        };
        let Some(m) = cors::find(&b.cors, origin, method.as_str(), &[]) else {
            return;
        };
        for (name, value) in m.headers() {
            if let Ok(v) = HeaderValue::from_str(&value) {
                hs.insert(HeaderName::from_static(name), v);
            }
        }
        hs.append(hyper::header::VARY, HeaderValue::from_static("Origin"));
    }
}

/// Largest request document (XML) the front end looks at; `s3s` refuses larger ones
/// anyway (its `xml_max_body_size`).
const MAX_DOCUMENT: usize = 20 << 20;

/// Why a document body was refused (status, code, message), set when its stream ends.
#[derive(Clone, Default)]
struct DocumentVerdict(Arc<Mutex<Option<(StatusCode, String, String)>>>);

impl DocumentVerdict {
    fn take(&self) -> Option<(StatusCode, String, String)> {
        self.0.lock().ok().and_then(|mut v| v.take())
    }
}

/// The body of a request whose body is a document (XML: lifecycle, CORS, tagging,
/// DeleteObjects…), checked as `s3s` reads it: its `Content-MD5` / `x-amz-checksum-*`
/// (`s3s` parses documents without looking at their checksums, and boto3 sends a CRC32 with
/// every one) and, for a lifecycle configuration, elements `s3s` would skip
/// ([`unsupported::check_lifecycle`]). Object and part data are verified as they stream, by
/// the handler.
///
/// `s3s` reads a document only after the signature and access checks, so an anonymous
/// client cannot make the gateway read one; when the stream ends the verdict is given, and
/// a refused document ends in an error instead (nothing is parsed or stored) which
/// [`Front::handle`] turns into the S3 answer.
struct DocumentCheck {
    inner: Body,
    seen: Vec<u8>,
    checks: Vec<(String, String)>,
    lifecycle: bool,
    verdict: DocumentVerdict,
    judged: bool,
}

impl DocumentCheck {
    /// The check a request's body needs, if it is a document with something to check.
    fn for_request(
        parts: &hyper::http::request::Parts,
        bucket: Option<&str>,
        has_key: bool,
    ) -> Option<(Vec<(String, String)>, bool)> {
        if !matches!(parts.method, Method::PUT | Method::POST) {
            return None;
        }
        let resource = match (bucket, has_key) {
            (None, _) => unsupported::Resource::Service,
            (Some(_), false) => unsupported::Resource::Bucket,
            (Some(_), true) => unsupported::Resource::Object,
        };
        let query = parts.uri.query();
        if unsupported::carries_object_data(&parts.method, resource, query, &parts.headers)
            // refused by the access hook (NotImplemented) rather than misread here
            || header(&parts.headers, "content-encoding").is_some_and(|e| e.contains("aws-chunked"))
        {
            return None;
        }
        let checks = unsupported::document_checks(&parts.headers);
        let lifecycle = unsupported::is_put_lifecycle(&parts.method, resource, query);
        (!checks.is_empty() || lifecycle).then_some((checks, lifecycle))
    }

    fn judge(&self) -> Option<(StatusCode, String, String)> {
        if self.seen.len() > MAX_DOCUMENT {
            // s3s answers MaxMessageLengthExceeded
            return None;
        }
        if let Err((code, msg)) = unsupported::verify_document(&self.checks, &self.seen) {
            return Some((StatusCode::BAD_REQUEST, code.as_str().to_string(), msg));
        }
        if self.lifecycle
            && let Some(r) = unsupported::check_lifecycle(&self.seen)
        {
            return Some((r.status(), r.code().to_string(), r.to_string()));
        }
        None
    }
}

impl hyper::body::Body for DocumentCheck {
    type Data = Bytes;
    type Error = s3s::StdError;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Option<Result<hyper::body::Frame<Bytes>, s3s::StdError>>> {
        use std::task::Poll;
        let this = self.get_mut();
        match Pin::new(&mut this.inner).poll_frame(cx) {
            Poll::Ready(Some(Ok(frame))) => {
                if let Some(data) = frame.data_ref()
                    && this.seen.len() <= MAX_DOCUMENT
                {
                    this.seen.extend_from_slice(data);
                }
                Poll::Ready(Some(Ok(frame)))
            }
            Poll::Ready(None) if !this.judged => {
                this.judged = true;
                match this.judge() {
                    Some(refusal) => {
                        let why = refusal.2.clone();
                        if let Ok(mut v) = this.verdict.0.lock() {
                            *v = Some(refusal);
                        }
                        Poll::Ready(Some(Err(why.into())))
                    }
                    None => Poll::Ready(None),
                }
            }
            other => other,
        }
    }

    fn is_end_stream(&self) -> bool {
        // not before the verdict: a reader that stops at "end" would skip the check
        self.judged && self.inner.is_end_stream()
    }

    fn size_hint(&self) -> hyper::body::SizeHint {
        self.inner.size_hint()
    }
}

/// The answer to a browser POST, as S3 gives it (see the module docs).
async fn post_answer(resp: Response<Body>, form: &FormFields) -> Response<Body> {
    let status = resp.status();
    let raw_key = form.field("key").unwrap_or_default().to_string();
    let key = form.resolve_key(&raw_key);
    if status == StatusCode::SEE_OTHER && key != raw_key {
        let (mut parts, body) = resp.into_parts();
        if let Some(loc) = parts.headers.get(hyper::header::LOCATION)
            && let Ok(loc) = loc.to_str()
        {
            let fixed = loc.replace(
                &format!("key={}", form_urlencode(&raw_key)),
                &format!("key={}", form_urlencode(&key)),
            );
            if let Ok(v) = HeaderValue::from_str(&fixed) {
                parts.headers.insert(hyper::header::LOCATION, v);
            }
        }
        return Response::from_parts(parts, body);
    }
    let rewrite = status == StatusCode::CREATED || status == StatusCode::BAD_REQUEST;
    if !rewrite {
        return resp;
    }
    let (mut parts, mut body) = resp.into_parts();
    let Ok(bytes) = body.store_all_limited(64 << 10).await else {
        return Response::from_parts(parts, body);
    };
    let text = String::from_utf8_lossy(&bytes).into_owned();
    if status == StatusCode::BAD_REQUEST {
        if xml_element(&text, "Code") == Some("InvalidPolicyDocument")
            && let Some(msg) = xml_element(&text, "Message")
            && msg.starts_with("Policy condition")
        {
            return error_response(
                StatusCode::FORBIDDEN,
                "AccessDenied",
                &format!("Invalid according to Policy: {}", xml_unescape(msg)),
            );
        }
        return Response::from_parts(parts, Body::from(bytes));
    }
    // the stored key, and the ETag quoted as S3 writes it
    let mut fixed = text.replace(&xml_escape(&raw_key), &xml_escape(&key));
    if let Some(etag) = xml_element(&fixed, "ETag")
        && !etag.starts_with('"')
        && !etag.starts_with("&quot;")
    {
        fixed = fixed.replace(
            &format!("<ETag>{etag}</ETag>"),
            &format!("<ETag>&quot;{etag}&quot;</ETag>"),
        );
    }
    let fixed = Bytes::from(fixed);
    parts.headers.remove(hyper::header::CONTENT_LENGTH);
    Response::from_parts(parts, Body::from(fixed))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn targets() {
        assert_eq!(target("/"), (None, false));
        assert_eq!(target("/b"), (Some("b".into()), false));
        assert_eq!(target("/b/"), (Some("b".into()), false));
        assert_eq!(target("/b/k/x"), (Some("b".into()), true));
    }

    /// Reads a body through [`DocumentCheck`] as `s3s` does: (what was read, the verdict).
    async fn read_document(
        body: &'static [u8],
        checks: &[(&str, &str)],
        lifecycle: bool,
    ) -> (bool, Option<String>) {
        let verdict = DocumentVerdict::default();
        let mut b = Body::http_body(DocumentCheck {
            inner: Body::from(Bytes::from_static(body)),
            seen: Vec::new(),
            checks: checks
                .iter()
                .map(|(a, v)| (a.to_string(), v.to_string()))
                .collect(),
            lifecycle,
            verdict: verdict.clone(),
            judged: false,
        });
        let read = b.store_all_limited(MAX_DOCUMENT).await.is_ok();
        (read, verdict.take().map(|(_, code, _)| code))
    }

    #[tokio::test]
    async fn documents_are_checked_as_they_are_read() {
        let doc = b"<Tagging><TagSet/></Tagging>";
        let crc = |d: &[u8]| {
            let mut h = s3s::checksum::ChecksumHasher {
                crc32: Some(Default::default()),
                ..Default::default()
            };
            h.update(d);
            h.finalize().checksum_crc32.unwrap()
        };
        let good = crc(doc);
        assert_eq!(
            read_document(doc, &[("crc32", &good)], false).await,
            (true, None)
        );
        assert_eq!(
            read_document(doc, &[("crc32", "AAAAAA==")], false).await,
            (false, Some("BadDigest".into()))
        );
        // an empty body is judged too (a reader that trusted "end of stream" would skip it)
        assert_eq!(
            // (the CRC32 of nothing is 0, AAAAAA==)
            read_document(b"", &[("crc32", "AAAAAQ==")], false).await,
            (false, Some("BadDigest".into()))
        );
        assert_eq!(
            read_document(b"", &[("crc32", &crc(b""))], false).await,
            (true, None)
        );
        let odd = b"<LifecycleConfiguration><Rule><Archive/></Rule></LifecycleConfiguration>";
        assert_eq!(
            read_document(odd, &[], true).await,
            (false, Some("MalformedXML".into()))
        );
    }

    #[test]
    fn encodings() {
        assert_eq!(
            form_urlencode("up/${filename} x"),
            "up%2F%24%7Bfilename%7D+x"
        );
        let s = "a<b>&'\"c";
        assert_eq!(xml_unescape(&xml_escape(s)), s);
        assert_eq!(
            xml_element(
                "<Error><Code>X</Code><Message>m</Message></Error>",
                "Message"
            ),
            Some("m")
        );
    }
}
