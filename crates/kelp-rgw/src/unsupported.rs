//! Refusal of S3 features the gateway does not implement.
//!
//! `s3s` parses every header and subresource AWS defines into typed inputs, and a handler that
//! does not look at a field ignores it: a PUT asking for server-side encryption would be stored
//! in the clear and answered 200, and the client would believe its data encrypted. That is
//! worse than an error. So every request passes [`check`] before its handler runs (from the
//! `s3s` access hook, after the signature check and before the body is read, so a refused
//! request stores nothing): whatever header, query subresource or form field asks for
//! something the gateway does not do is refused with the code AWS uses for it.
//!
//! Invariant: a feature listed here as refused has no code path that could honour it; when a
//! feature is implemented, its rule here goes. The function is pure (no I/O) so that each rule
//! has a unit test; the few answers that depend on the bucket (`x-amz-expected-bucket-owner`,
//! "no such configuration" answers that must first check the bucket exists and is the
//! caller's) are finished by the caller, see [`Refusal::bucket_check`].
//!
//! What is verified rather than refused: the checksums default clients send (boto3 ≥ 1.36 and
//! the aws CLI add `x-amz-checksum-crc32` to every upload): an object or part body is checked
//! as it streams ([`crate::s3`]'s `BodyChecks`), an XML request document by the front end with
//! [`verify_document`] as `s3s` reads it (after the signature check) and before it parses it.
//! Here only their shape is checked (one algorithm, a known one, a trailer that names it).

use hyper::header::HeaderMap;
use hyper::{Method, StatusCode};
use s3s::{S3Error, S3ErrorCode};

/// What a request's path names.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Resource {
    /// `/` (ListBuckets).
    Service,
    Bucket,
    Object,
}

/// Whether the gateway must look at the bucket before answering a refusal.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BucketCheck {
    /// No: the answer is the same for every bucket.
    None,
    /// The bucket must exist (`NoSuchBucket` first, as AWS answers).
    Exists,
    /// The bucket must exist and be the caller's (`AccessDenied` to others): reads of a
    /// bucket's configuration are the owner's.
    Owner,
}

/// A request the gateway refuses, with the S3 error AWS gives for it.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Refusal {
    /// A feature the gateway does not implement (`501 NotImplemented`).
    #[error("{0} is not implemented by this gateway")]
    NotImplemented(String),
    /// A header or parameter value that is not valid (`400 InvalidArgument`).
    #[error("{0}")]
    InvalidArgument(String),
    /// A request that cannot apply (`400 InvalidRequest`).
    #[error("{0}")]
    InvalidRequest(String),
    /// An object lock header or subresource: no bucket has an Object Lock configuration
    /// (`400 InvalidRequest`, as AWS answers on such a bucket).
    #[error("Bucket is missing Object Lock Configuration (object lock is not supported: {0})")]
    NoObjectLock(String),
    /// A document with an element S3 does not define there (`400 MalformedXML`): `s3s`
    /// skips unknown elements, which would drop what they ask for in silence.
    #[error(
        "The XML you provided was not well-formed or did not validate against our published schema: {0}"
    )]
    MalformedXml(String),
    /// A storage class other than STANDARD (`400 InvalidStorageClass`).
    #[error("the storage class '{0}' is not offered; Kelp stores every object as STANDARD")]
    InvalidStorageClass(String),
    /// A read of a bucket configuration the gateway never stores: AWS's answer for a bucket
    /// without one (`404` and its own code, e.g. `NoSuchBucketPolicy`).
    #[error("The bucket has no {what} (Kelp does not implement it)")]
    NoConfiguration {
        code: &'static str,
        what: &'static str,
    },
}

impl Refusal {
    pub fn code(&self) -> &'static str {
        match self {
            Refusal::NotImplemented(_) => "NotImplemented",
            Refusal::InvalidArgument(_) => "InvalidArgument",
            Refusal::InvalidRequest(_) | Refusal::NoObjectLock(_) => "InvalidRequest",
            Refusal::InvalidStorageClass(_) => "InvalidStorageClass",
            Refusal::MalformedXml(_) => "MalformedXML",
            Refusal::NoConfiguration { code, .. } => code,
        }
    }

    pub fn status(&self) -> StatusCode {
        match self {
            Refusal::NotImplemented(_) => StatusCode::NOT_IMPLEMENTED,
            Refusal::NoConfiguration { .. } => StatusCode::NOT_FOUND,
            _ => StatusCode::BAD_REQUEST,
        }
    }

    /// What the caller must check about the bucket before giving this answer.
    pub fn bucket_check(&self) -> BucketCheck {
        match self {
            Refusal::NoConfiguration { .. } => BucketCheck::Owner,
            Refusal::NoObjectLock(_) => BucketCheck::Exists,
            _ => BucketCheck::None,
        }
    }
}

impl From<Refusal> for S3Error {
    fn from(r: Refusal) -> S3Error {
        let code = S3ErrorCode::from_bytes(r.code().as_bytes())
            .unwrap_or_else(|| S3ErrorCode::Custom(r.code().into()));
        let mut e = S3Error::with_message(code, r.to_string());
        e.set_status_code(r.status());
        e
    }
}

/// The checksum algorithms the gateway computes (and so verifies), by their header suffix.
pub const CHECKSUMS: &[&str] = &["crc32", "crc32c", "crc64nvme", "sha1", "sha256"];

/// Query parameters the gateway understands (subresources it implements, the parameters of
/// the operations it implements, presigned-URL authentication). Names are case-sensitive, as
/// in S3.
const KNOWN_PARAMS: &[&str] = &[
    "acl",
    "cors",
    "delete",
    "lifecycle",
    "location",
    "tagging",
    "uploads",
    "versioning",
    "versions",
    "uploadId",
    "partNumber",
    "versionId",
    "list-type",
    "prefix",
    "delimiter",
    "marker",
    "max-keys",
    "encoding-type",
    "continuation-token",
    "fetch-owner",
    "start-after",
    "key-marker",
    "version-id-marker",
    "upload-id-marker",
    "max-uploads",
    "max-parts",
    "part-number-marker",
    "max-buckets",
    "bucket-region",
    "x-id",
    "response-content-type",
    "response-content-language",
    "response-expires",
    "response-cache-control",
    "response-content-disposition",
    "response-content-encoding",
    "X-Amz-Algorithm",
    "X-Amz-Credential",
    "X-Amz-Date",
    "X-Amz-Expires",
    "X-Amz-SignedHeaders",
    "X-Amz-Signature",
    "X-Amz-Security-Token",
    "AWSAccessKeyId",
    "Signature",
    "Expires",
];

/// `x-amz-*` query parameters that are not headers moved into the query, or whose being
/// ignored changes nothing (SigV4 presigned-URL authentication is case-insensitive here).
const HOISTED_OK: &[&str] = &[
    "x-amz-algorithm",
    "x-amz-credential",
    "x-amz-date",
    "x-amz-expires",
    "x-amz-signedheaders",
    "x-amz-signature",
    "x-amz-security-token",
    "x-amz-content-sha256",
    "x-amz-user-agent",
    // no checksum is stored with an object, so there is none to return either way
    "x-amz-checksum-mode",
];

/// S3 subresources the gateway does not implement: (name, on objects rather than buckets).
const UNIMPLEMENTED_SUBRESOURCES: &[(&str, bool)] = &[
    ("accelerate", false),
    ("analytics", false),
    ("encryption", false),
    ("intelligent-tiering", false),
    ("inventory", false),
    ("logging", false),
    ("metadataConfiguration", false),
    ("metadataTable", false),
    ("metrics", false),
    ("notification", false),
    ("object-lock", false),
    ("ownershipControls", false),
    ("policy", false),
    ("policyStatus", false),
    ("publicAccessBlock", false),
    ("replication", false),
    ("requestPayment", false),
    ("session", false),
    ("website", false),
    ("attributes", true),
    ("legal-hold", true),
    ("renameObject", true),
    ("restore", true),
    ("retention", true),
    ("select", true),
    ("select-type", true),
    ("torrent", true),
];

/// The operation a request is, as far as the rules below need to know.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Op {
    PutObject,
    CopyObject,
    CreateMultipartUpload,
    UploadPart,
    UploadPartCopy,
    CompleteMultipartUpload,
    /// A browser form upload (its fields are checked by [`check_form`]).
    PostObject,
    GetObject,
    DeleteObject,
    CreateBucket,
    /// Anything else: an operation on a subresource (ACLs, tagging…), a listing, a deletion
    /// of a bucket or of many objects.
    Other,
}

/// A parsed query string: (name, value), percent-decoded.
fn query_pairs(query: Option<&str>) -> Vec<(String, String)> {
    let decode = |s: &str| {
        percent_encoding::percent_decode_str(&s.replace('+', " "))
            .decode_utf8_lossy()
            .into_owned()
    };
    query
        .unwrap_or("")
        .split('&')
        .filter(|p| !p.is_empty())
        .map(|p| {
            let (n, v) = p.split_once('=').unwrap_or((p, ""));
            (decode(n), decode(v))
        })
        .collect()
}

/// The headers of a request, and the `x-amz-*` parameters of its query string: a presigned
/// URL may carry headers there (SDKs "hoist" them), and they must not escape the rules.
struct Headers<'a> {
    map: &'a HeaderMap,
    query: &'a [(String, String)],
}

impl Headers<'_> {
    fn get(&self, name: &str) -> Option<&str> {
        if let Some(v) = self.map.get(name) {
            // a value that is not text is still a value someone asked for
            return Some(v.to_str().unwrap_or("\u{fffd}"));
        }
        self.query
            .iter()
            .find(|(n, _)| n.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
    }

    fn has(&self, name: &str) -> bool {
        self.get(name).is_some()
    }

    /// Names (lowercase) of the headers and hoisted parameters that start with `prefix`.
    fn names_with_prefix(&self, prefix: &str) -> Vec<String> {
        let mut out: Vec<String> = self
            .map
            .keys()
            .map(|k| k.as_str().to_string())
            .chain(self.query.iter().map(|(n, _)| n.to_ascii_lowercase()))
            .filter(|n| n.starts_with(prefix))
            .collect();
        out.sort();
        out.dedup();
        out
    }
}

fn classify(method: &Method, resource: Resource, q: &[(String, String)], h: &Headers<'_>) -> Op {
    let has = |name: &str| q.iter().any(|(n, _)| n == name);
    let copy = h.has("x-amz-copy-source");
    match (resource, method.as_str()) {
        (Resource::Object, "PUT") if has("partNumber") && has("uploadId") => {
            if copy {
                Op::UploadPartCopy
            } else {
                Op::UploadPart
            }
        }
        (Resource::Object, "PUT") if has("tagging") || has("acl") => Op::Other,
        (Resource::Object, "PUT") if copy => Op::CopyObject,
        (Resource::Object, "PUT") => Op::PutObject,
        (Resource::Object, "POST") if has("uploads") => Op::CreateMultipartUpload,
        (Resource::Object, "POST") if has("uploadId") => Op::CompleteMultipartUpload,
        (Resource::Object, "GET" | "HEAD") if !has("tagging") && !has("acl") => Op::GetObject,
        (Resource::Object, "DELETE") if !has("uploadId") && !has("tagging") => Op::DeleteObject,
        (Resource::Bucket, "PUT") if q.is_empty() => Op::CreateBucket,
        (Resource::Bucket, "POST") if !has("delete") => Op::PostObject,
        _ => Op::Other,
    }
}

/// The refusal for a request, if it asks for something the gateway does not do.
///
/// `query` is the raw query string; `headers` the request's headers. The body is not looked
/// at: the refusal comes before it is read.
pub fn check(
    method: &Method,
    resource: Resource,
    query: Option<&str>,
    headers: &HeaderMap,
) -> Option<Refusal> {
    let q = query_pairs(query);
    let h = Headers {
        map: headers,
        query: &q,
    };
    if let Some(r) = check_query(method, resource, &q) {
        return Some(r);
    }
    let op = classify(method, resource, &q, &h);
    check_headers(op, &h)
}

/// The fields of a browser POST form (names lowercased), checked as the headers of a PUT
/// (a form field is S3's way to give a header) plus the form's own unsupported fields.
pub fn check_form(fields: &[(String, String)]) -> Option<Refusal> {
    let map = HeaderMap::new();
    let h = Headers {
        map: &map,
        query: fields,
    };
    if h.has("tagging") {
        return Some(Refusal::NotImplemented("the form field 'tagging'".into()));
    }
    check_headers(Op::PostObject, &h)
}

fn check_query(method: &Method, resource: Resource, q: &[(String, String)]) -> Option<Refusal> {
    let read = matches!(method.as_str(), "GET" | "HEAD");
    for (name, value) in q {
        if KNOWN_PARAMS.contains(&name.as_str()) {
            continue;
        }
        let lower = name.to_ascii_lowercase();
        if lower.starts_with("x-amz-") {
            if HOISTED_OK.contains(&lower.as_str()) {
                continue;
            }
            // A header some SDKs move into a presigned URL's query: `s3s` reads headers
            // only, so it would be ignored (an ACL, a checksum, an expected owner…).
            return Some(Refusal::NotImplemented(format!(
                "the header {name} in the query string (send it as a header)"
            )));
        }
        if let Some((_, on_object)) = UNIMPLEMENTED_SUBRESOURCES.iter().find(|(n, _)| n == name) {
            let here = (resource == Resource::Object) == *on_object;
            return Some(if read && here {
                absent_configuration(name)
            } else {
                Refusal::NotImplemented(format!("the subresource ?{name}"))
            });
        }
        // An unknown parameter without a value names a subresource (that is how S3 spells
        // them) that this gateway does not know: answering it as the plain operation on the
        // bucket or object would be a silent success. One with a value is ignored, as AWS
        // ignores unknown parameters (cache-busting `?v=3` on a public object).
        if value.is_empty() {
            return Some(Refusal::NotImplemented(format!(
                "the unknown subresource ?{name}"
            )));
        }
    }
    None
}

/// AWS's answer to a read of a subresource the bucket or object cannot have.
fn absent_configuration(name: &str) -> Refusal {
    let (code, what) = match name {
        "encryption" => (
            "ServerSideEncryptionConfigurationNotFoundError",
            "server-side encryption configuration",
        ),
        "policy" | "policyStatus" => ("NoSuchBucketPolicy", "bucket policy"),
        "replication" => (
            "ReplicationConfigurationNotFoundError",
            "replication configuration",
        ),
        "website" => ("NoSuchWebsiteConfiguration", "website configuration"),
        "object-lock" => (
            "ObjectLockConfigurationNotFoundError",
            "Object Lock configuration",
        ),
        "publicAccessBlock" => (
            "NoSuchPublicAccessBlockConfiguration",
            "public access block configuration",
        ),
        "retention" | "legal-hold" => {
            return Refusal::NoObjectLock(format!("no object has a {name}"));
        }
        _ => return Refusal::NotImplemented(format!("the subresource ?{name}")),
    };
    Refusal::NoConfiguration { code, what }
}

fn check_headers(op: Op, h: &Headers<'_>) -> Option<Refusal> {
    use Op::*;
    let data = matches!(op, PutObject | UploadPart | PostObject);

    // Grants: only canned ACLs are stored.
    if let Some(g) = h.names_with_prefix("x-amz-grant-").first() {
        return Some(Refusal::NotImplemented(format!(
            "the header {g} (explicit grants; use a canned ACL, x-amz-acl)"
        )));
    }

    // Server-side encryption: nothing is encrypted, so no request may believe it was.
    let sse_c = [
        "x-amz-server-side-encryption-customer-algorithm",
        "x-amz-server-side-encryption-customer-key",
        "x-amz-server-side-encryption-customer-key-md5",
    ];
    let sse = [
        "x-amz-server-side-encryption",
        "x-amz-server-side-encryption-aws-kms-key-id",
        "x-amz-server-side-encryption-context",
    ];
    if let Some(name) = sse_c.iter().find(|n| h.has(n)) {
        return Some(match op {
            // AWS's answer for an object that is not SSE-C encrypted; none is
            GetObject | CompleteMultipartUpload => Refusal::InvalidRequest(format!(
                "{name}: the encryption parameters are not applicable to this object \
                 (Kelp does not encrypt objects with customer keys)"
            )),
            _ => Refusal::NotImplemented(format!(
                "server-side encryption with customer keys ({name})"
            )),
        });
    }
    if let Some(name) = sse.iter().find(|n| h.has(n)) {
        return Some(match op {
            GetObject => Refusal::InvalidArgument(format!(
                "the {name} header is not supported for this operation"
            )),
            _ => Refusal::NotImplemented(format!("server-side encryption ({name})")),
        });
    }
    if h.get("x-amz-server-side-encryption-bucket-key-enabled")
        .is_some_and(|v| !v.eq_ignore_ascii_case("false"))
    {
        return Some(Refusal::NotImplemented(
            "server-side encryption (x-amz-server-side-encryption-bucket-key-enabled)".into(),
        ));
    }
    if let Some(name) = h
        .names_with_prefix("x-amz-copy-source-server-side-encryption-customer-")
        .first()
    {
        return Some(Refusal::InvalidRequest(format!(
            "{name}: the encryption parameters are not applicable to the source object \
             (Kelp does not encrypt objects with customer keys)"
        )));
    }

    // Object lock: no bucket can have it.
    for name in [
        "x-amz-object-lock-mode",
        "x-amz-object-lock-retain-until-date",
        "x-amz-object-lock-legal-hold",
    ] {
        if h.has(name) {
            return Some(Refusal::NoObjectLock(format!("the header {name}")));
        }
    }
    if h.get("x-amz-bypass-governance-retention")
        .is_some_and(|v| !v.eq_ignore_ascii_case("false"))
    {
        return Some(Refusal::NoObjectLock(
            "the header x-amz-bypass-governance-retention".into(),
        ));
    }
    if op == CreateBucket
        && h.get("x-amz-bucket-object-lock-enabled")
            .is_some_and(|v| !v.eq_ignore_ascii_case("false"))
    {
        return Some(Refusal::NotImplemented("object lock".into()));
    }
    if op == CreateBucket && h.has("x-amz-object-ownership") {
        return Some(Refusal::NotImplemented(
            "object ownership settings (x-amz-object-ownership)".into(),
        ));
    }

    // Features of other products S3 folds into headers.
    if let Some(sc) = h.get("x-amz-storage-class")
        && sc != "STANDARD"
    {
        return Some(Refusal::InvalidStorageClass(sc.to_string()));
    }
    if h.has("x-amz-website-redirect-location") {
        return Some(Refusal::NotImplemented(
            "website redirects (x-amz-website-redirect-location)".into(),
        ));
    }
    if h.has("x-amz-mfa") {
        return Some(Refusal::NotImplemented("MFA delete (x-amz-mfa)".into()));
    }
    if h.has("x-amz-write-offset-bytes") {
        return Some(Refusal::NotImplemented(
            "appends (x-amz-write-offset-bytes)".into(),
        ));
    }
    for name in [
        "x-amz-if-match-last-modified-time",
        "x-amz-if-match-size",
        "x-amz-if-match-initiated-time",
    ] {
        if h.has(name) {
            return Some(Refusal::NotImplemented(format!("the condition {name}")));
        }
    }
    // Kelp bills nobody: a requester's agreement to pay is accepted, anything else is not a
    // value S3 knows.
    if let Some(v) = h.get("x-amz-request-payer")
        && v != "requester"
    {
        return Some(Refusal::InvalidArgument(format!(
            "x-amz-request-payer must be 'requester', not '{v}'"
        )));
    }
    if op == CopyObject {
        for name in ["x-amz-metadata-directive", "x-amz-tagging-directive"] {
            if let Some(v) = h.get(name)
                && v != "COPY"
                && v != "REPLACE"
            {
                return Some(Refusal::InvalidArgument(format!(
                    "unknown {name} '{v}' (COPY or REPLACE)"
                )));
            }
        }
    }

    // Conditional writes: PutObject, CopyObject and CompleteMultipartUpload honour
    // `If-None-Match: *` and `If-Match`; AWS implements nothing else.
    if let Some(v) = h.get("if-none-match")
        && matches!(
            op,
            PutObject | CopyObject | CompleteMultipartUpload | PostObject
        )
        && v.trim() != "*"
    {
        return Some(Refusal::NotImplemented(format!(
            "If-None-Match: {v} on a write (only '*' is)"
        )));
    }
    if matches!(
        op,
        UploadPart | UploadPartCopy | CreateMultipartUpload | PostObject
    ) {
        for name in ["if-match", "if-none-match"] {
            if h.has(name) {
                return Some(Refusal::NotImplemented(format!(
                    "conditional {name} on this operation"
                )));
            }
        }
    }

    check_checksums(op, data, h)
}

/// Checksum headers: their shape (a body's value is verified as it streams).
fn check_checksums(op: Op, data: bool, h: &Headers<'_>) -> Option<Refusal> {
    use Op::*;
    let values: Vec<String> = h
        .names_with_prefix("x-amz-checksum-")
        .into_iter()
        .filter(|n| {
            !matches!(
                n.as_str(),
                "x-amz-checksum-mode" | "x-amz-checksum-algorithm" | "x-amz-checksum-type"
            )
        })
        .collect();
    let alg_of = |name: &str| name.strip_prefix("x-amz-checksum-").map(str::to_string);
    for n in &values {
        let alg = alg_of(n).unwrap_or_default();
        if !CHECKSUMS.contains(&alg.as_str()) {
            return Some(Refusal::NotImplemented(format!(
                "the checksum algorithm of {n}"
            )));
        }
    }
    if values.len() > 1 {
        return Some(Refusal::InvalidRequest(
            "Expecting a single x-amz-checksum- header. Multiple checksum Types are not allowed."
                .into(),
        ));
    }
    let trailer = h
        .get("x-amz-trailer")
        .map(|t| t.trim().to_ascii_lowercase());
    if let Some(t) = &trailer {
        let known = alg_of(t).is_some_and(|a| CHECKSUMS.contains(&a.as_str()));
        if !known {
            return Some(Refusal::InvalidRequest(format!(
                "x-amz-trailer '{t}' is not supported (one x-amz-checksum-<algorithm> is)"
            )));
        }
        if !data {
            return Some(Refusal::NotImplemented(
                "trailing checksums on this operation".into(),
            ));
        }
        if !values.is_empty() {
            return Some(Refusal::InvalidRequest(
                "Expecting a single x-amz-checksum- header. Multiple checksum Types are not allowed."
                    .into(),
            ));
        }
    }
    let given = values.first().cloned().or(trailer);
    if let Some(sdk) = h.get("x-amz-sdk-checksum-algorithm") {
        let sdk = sdk.to_ascii_lowercase();
        if !CHECKSUMS.contains(&sdk.as_str()) {
            return Some(Refusal::InvalidRequest(
                "Value for x-amz-sdk-checksum-algorithm header is invalid.".into(),
            ));
        }
        match &given {
            None => {
                return Some(Refusal::InvalidRequest(
                    "x-amz-sdk-checksum-algorithm specified, but no corresponding \
                     x-amz-checksum-* or x-amz-trailer headers were found."
                        .into(),
                ));
            }
            Some(g) if alg_of(g).as_deref() != Some(sdk.as_str()) => {
                return Some(Refusal::InvalidRequest(format!(
                    "x-amz-sdk-checksum-algorithm is {sdk} but the checksum given is {g}"
                )));
            }
            Some(_) => {}
        }
    }
    if let Some(a) = h.get("x-amz-checksum-algorithm")
        && matches!(op, CreateMultipartUpload | CopyObject)
        && !CHECKSUMS.contains(&a.to_ascii_lowercase().as_str())
    {
        return Some(Refusal::InvalidRequest(format!(
            "the checksum algorithm '{a}' is not supported"
        )));
    }
    if let Some(t) = h.get("x-amz-checksum-type")
        && matches!(op, CreateMultipartUpload | CompleteMultipartUpload)
    {
        return Some(Refusal::NotImplemented(format!(
            "whole-object checksums of multipart uploads (x-amz-checksum-type: {t})"
        )));
    }
    if op == CompleteMultipartUpload
        && let Some(n) = values.first()
    {
        return Some(Refusal::NotImplemented(format!(
            "whole-object checksums of multipart uploads ({n})"
        )));
    }
    if !values.is_empty()
        && matches!(
            op,
            CopyObject | UploadPartCopy | CreateMultipartUpload | GetObject | DeleteObject
        )
    {
        return Some(Refusal::InvalidRequest(format!(
            "{} is not allowed on this operation (it carries no body)",
            values[0]
        )));
    }
    if !values.is_empty()
        && !data
        && h.get("content-encoding")
            .is_some_and(|e| e.to_ascii_lowercase().contains("aws-chunked"))
    {
        return Some(Refusal::NotImplemented(
            "checksums of aws-chunked request documents".into(),
        ));
    }
    None
}

/// Whether a request's body is an object's (or a part's) data, verified as it streams by
/// the handler, rather than a small document (XML) that the front end verifies whole.
pub fn carries_object_data(
    method: &Method,
    resource: Resource,
    query: Option<&str>,
    headers: &HeaderMap,
) -> bool {
    let q = query_pairs(query);
    let h = Headers {
        map: headers,
        query: &q,
    };
    matches!(
        classify(method, resource, &q, &h),
        Op::PutObject | Op::UploadPart | Op::PostObject
    )
}

/// The checksums a document body must match: (algorithm, expected value as sent), from
/// `Content-MD5` and the `x-amz-checksum-*` headers. Empty: nothing to verify.
pub fn document_checks(headers: &HeaderMap) -> Vec<(String, String)> {
    let mut out = Vec::new();
    if let Some(v) = headers.get("content-md5").and_then(|v| v.to_str().ok()) {
        out.push(("md5".to_string(), v.to_string()));
    }
    for alg in CHECKSUMS {
        if let Some(v) = headers
            .get(format!("x-amz-checksum-{alg}"))
            .and_then(|v| v.to_str().ok())
        {
            out.push((alg.to_string(), v.to_string()));
        }
    }
    out
}

/// Verifies a whole document body against [`document_checks`]: `BadDigest` on a mismatch
/// (`InvalidDigest` for a Content-MD5 that is not base64 MD5), as AWS answers.
pub fn verify_document(
    checks: &[(String, String)],
    body: &[u8],
) -> Result<(), (S3ErrorCode, String)> {
    use base64::Engine;
    for (alg, want) in checks {
        if alg == "md5" {
            let want = base64::engine::general_purpose::STANDARD
                .decode(want)
                .ok()
                .filter(|d| d.len() == 16)
                .ok_or((
                    S3ErrorCode::InvalidDigest,
                    "Content-MD5 is not a base64 MD5".to_string(),
                ))?;
            let mut md5 = md5_many::Md5State::new();
            md5.update(body);
            if md5.finalize().as_slice() != want.as_slice() {
                return Err((
                    S3ErrorCode::BadDigest,
                    "The Content-MD5 you specified did not match what we received.".into(),
                ));
            }
            continue;
        }
        let mut hasher = s3s::checksum::ChecksumHasher::default();
        match alg.as_str() {
            "crc32" => hasher.crc32 = Some(Default::default()),
            "crc32c" => hasher.crc32c = Some(Default::default()),
            "crc64nvme" => hasher.crc64nvme = Some(Default::default()),
            "sha1" => hasher.sha1 = Some(Default::default()),
            "sha256" => hasher.sha256 = Some(Default::default()),
            _ => continue,
        }
        hasher.update(body);
        let got = hasher.finalize();
        let have = [
            got.checksum_crc32,
            got.checksum_crc32c,
            got.checksum_crc64nvme,
            got.checksum_sha1,
            got.checksum_sha256,
        ]
        .into_iter()
        .flatten()
        .next()
        .unwrap_or_default();
        if &have != want {
            return Err((
                S3ErrorCode::BadDigest,
                format!(
                    "The {} you specified did not match the calculated checksum.",
                    alg.to_ascii_uppercase()
                ),
            ));
        }
    }
    Ok(())
}

/// The elements a lifecycle configuration may hold (transitions among them: the handler
/// refuses those with `NotImplemented`, which says more than `MalformedXML`).
const LIFECYCLE_ELEMENTS: &[&str] = &[
    "LifecycleConfiguration",
    "Rule",
    "ID",
    "Prefix",
    "Filter",
    "And",
    "Tag",
    "Key",
    "Value",
    "ObjectSizeGreaterThan",
    "ObjectSizeLessThan",
    "Status",
    "Expiration",
    "Days",
    "Date",
    "ExpiredObjectDeleteMarker",
    "NoncurrentVersionExpiration",
    "NoncurrentDays",
    "NewerNoncurrentVersions",
    "AbortIncompleteMultipartUpload",
    "DaysAfterInitiation",
    "Transition",
    "NoncurrentVersionTransition",
    "StorageClass",
];

/// Whether a request is PutBucketLifecycleConfiguration, whose document [`check_lifecycle`]
/// reads before `s3s` parses it.
pub fn is_put_lifecycle(method: &Method, resource: Resource, query: Option<&str>) -> bool {
    method == Method::PUT
        && resource == Resource::Bucket
        && query_pairs(query).iter().any(|(n, _)| n == "lifecycle")
}

/// Refuses a lifecycle configuration naming an element S3 does not define (an action or a
/// filter from a newer S3, a typo): `s3s` would skip it and the rule would be stored without
/// it. Only element names are looked at; the parser judges the rest.
pub fn check_lifecycle(xml: &[u8]) -> Option<Refusal> {
    let text = String::from_utf8_lossy(xml);
    let mut rest = text.as_ref();
    while let Some(i) = rest.find('<') {
        rest = &rest[i + 1..];
        if rest.starts_with('/') || rest.starts_with('?') || rest.starts_with('!') {
            continue;
        }
        let end = rest
            .find(|c: char| c.is_whitespace() || c == '>' || c == '/')
            .unwrap_or(rest.len());
        let name = &rest[..end];
        // a namespace prefix (`s3:Rule`) names the same element
        let local = name.rsplit(':').next().unwrap_or(name);
        if !LIFECYCLE_ELEMENTS.contains(&local) {
            return Some(Refusal::MalformedXml(format!(
                "unknown element <{name}> in a lifecycle configuration"
            )));
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;
    use hyper::header::{HeaderName, HeaderValue};

    fn headers(pairs: &[(&str, &str)]) -> HeaderMap {
        let mut h = HeaderMap::new();
        for (n, v) in pairs {
            h.insert(
                HeaderName::from_bytes(n.as_bytes()).unwrap(),
                HeaderValue::from_str(v).unwrap(),
            );
        }
        h
    }

    /// The code of the refusal of `method` on `resource` with `query` and `pairs` (None:
    /// accepted).
    fn code(
        method: Method,
        resource: Resource,
        query: &str,
        pairs: &[(&str, &str)],
    ) -> Option<&'static str> {
        let q = (!query.is_empty()).then_some(query);
        check(&method, resource, q, &headers(pairs)).map(|r| r.code())
    }

    fn put(pairs: &[(&str, &str)]) -> Option<&'static str> {
        code(Method::PUT, Resource::Object, "", pairs)
    }

    #[test]
    fn plain_requests_pass() {
        assert_eq!(put(&[]), None);
        assert_eq!(
            put(&[("x-amz-acl", "public-read"), ("x-amz-meta-a", "b")]),
            None
        );
        assert_eq!(put(&[("x-amz-storage-class", "STANDARD")]), None);
        assert_eq!(
            code(
                Method::GET,
                Resource::Bucket,
                "list-type=2&prefix=&max-keys=10",
                &[]
            ),
            None
        );
        assert_eq!(
            code(Method::GET, Resource::Bucket, "versions&key-marker=a", &[]),
            None
        );
        assert_eq!(
            code(
                Method::GET,
                Resource::Object,
                "versionId=abc&partNumber=1",
                &[]
            ),
            None
        );
        assert_eq!(
            code(
                Method::PUT,
                Resource::Object,
                "partNumber=1&uploadId=x",
                &[]
            ),
            None
        );
        assert_eq!(code(Method::POST, Resource::Bucket, "delete", &[]), None);
        assert_eq!(code(Method::PUT, Resource::Bucket, "lifecycle", &[]), None);
        assert_eq!(
            code(Method::GET, Resource::Object, "x-id=GetObject", &[]),
            None
        );
        // presigned URLs
        assert_eq!(
            code(
                Method::GET,
                Resource::Object,
                "X-Amz-Algorithm=AWS4-HMAC-SHA256&X-Amz-Credential=a&X-Amz-Date=b&X-Amz-Expires=60&X-Amz-SignedHeaders=host&X-Amz-Signature=c",
                &[]
            ),
            None
        );
        // an unknown parameter with a value is ignored, as AWS does (cache busting)
        assert_eq!(code(Method::GET, Resource::Object, "v=3", &[]), None);
        // a requester's agreement to pay: nobody pays
        assert_eq!(put(&[("x-amz-request-payer", "requester")]), None);
        assert_eq!(
            put(&[("x-amz-server-side-encryption-bucket-key-enabled", "false")]),
            None
        );
        assert_eq!(put(&[("x-amz-bypass-governance-retention", "false")]), None);
    }

    #[test]
    fn encryption_is_refused() {
        for h in [
            ("x-amz-server-side-encryption", "AES256"),
            ("x-amz-server-side-encryption", "aws:kms"),
            ("x-amz-server-side-encryption-aws-kms-key-id", "k"),
            ("x-amz-server-side-encryption-context", "e30="),
            ("x-amz-server-side-encryption-bucket-key-enabled", "true"),
            ("x-amz-server-side-encryption-customer-algorithm", "AES256"),
            ("x-amz-server-side-encryption-customer-key", "a2V5"),
            ("x-amz-server-side-encryption-customer-key-MD5", "bWQ1"),
        ] {
            assert_eq!(put(&[h]), Some("NotImplemented"), "{h:?}");
            assert_eq!(
                code(Method::POST, Resource::Object, "uploads", &[h]),
                Some("NotImplemented")
            );
            assert_eq!(
                code(
                    Method::PUT,
                    Resource::Object,
                    "partNumber=1&uploadId=u",
                    &[h]
                ),
                Some("NotImplemented")
            );
            assert_eq!(
                put(&[("x-amz-copy-source", "/b/k"), h]),
                Some("NotImplemented")
            );
        }
        // reads: an object that is not SSE-C encrypted (none is), as AWS answers
        let ssec = ("x-amz-server-side-encryption-customer-algorithm", "AES256");
        assert_eq!(
            code(Method::GET, Resource::Object, "", &[ssec]),
            Some("InvalidRequest")
        );
        assert_eq!(
            code(Method::HEAD, Resource::Object, "", &[ssec]),
            Some("InvalidRequest")
        );
        assert_eq!(
            code(
                Method::GET,
                Resource::Object,
                "",
                &[("x-amz-server-side-encryption", "AES256")]
            ),
            Some("InvalidArgument")
        );
        let src = (
            "x-amz-copy-source-server-side-encryption-customer-algorithm",
            "AES256",
        );
        assert_eq!(
            put(&[("x-amz-copy-source", "/b/k"), src]),
            Some("InvalidRequest")
        );
        // any header there: s3s would not read it (an ACL, a checksum…)
        for q in [
            "x-amz-acl=public-read",
            "x-amz-checksum-crc32=AAAAAA==",
            "X-Amz-Meta-A=b",
        ] {
            assert_eq!(
                code(Method::PUT, Resource::Object, q, &[]),
                Some("NotImplemented"),
                "{q}"
            );
        }
        assert_eq!(
            code(
                Method::GET,
                Resource::Object,
                "x-amz-checksum-mode=ENABLED",
                &[]
            ),
            None
        );
        // hoisted into a presigned URL's query
        assert_eq!(
            code(
                Method::PUT,
                Resource::Object,
                "x-amz-server-side-encryption=AES256",
                &[]
            ),
            Some("NotImplemented")
        );
        // the form of a browser upload
        let f = |n: &str, v: &str| vec![(n.to_string(), v.to_string())];
        assert_eq!(
            check_form(&f("x-amz-server-side-encryption", "AES256")).map(|r| r.code()),
            Some("NotImplemented")
        );
        assert_eq!(check_form(&f("key", "a")), None);
        assert_eq!(
            check_form(&f("tagging", "<Tagging/>")).map(|r| r.code()),
            Some("NotImplemented")
        );
        assert_eq!(
            check_form(&f("x-amz-storage-class", "GLACIER")).map(|r| r.code()),
            Some("InvalidStorageClass")
        );
    }

    #[test]
    fn object_lock_is_refused() {
        for h in [
            ("x-amz-object-lock-mode", "GOVERNANCE"),
            (
                "x-amz-object-lock-retain-until-date",
                "2030-01-01T00:00:00Z",
            ),
            ("x-amz-object-lock-legal-hold", "ON"),
        ] {
            let r = check(&Method::PUT, Resource::Object, None, &headers(&[h])).unwrap();
            assert_eq!(r.code(), "InvalidRequest");
            assert_eq!(r.bucket_check(), BucketCheck::Exists);
        }
        assert_eq!(
            code(
                Method::DELETE,
                Resource::Object,
                "",
                &[("x-amz-bypass-governance-retention", "true")]
            ),
            Some("InvalidRequest")
        );
        assert_eq!(
            code(
                Method::PUT,
                Resource::Bucket,
                "",
                &[("x-amz-bucket-object-lock-enabled", "true")]
            ),
            Some("NotImplemented")
        );
        assert_eq!(
            code(
                Method::PUT,
                Resource::Bucket,
                "",
                &[("x-amz-object-ownership", "ObjectWriter")]
            ),
            Some("NotImplemented")
        );
        assert_eq!(
            code(Method::GET, Resource::Bucket, "object-lock", &[]),
            Some("ObjectLockConfigurationNotFoundError")
        );
        assert_eq!(
            code(Method::PUT, Resource::Bucket, "object-lock", &[]),
            Some("NotImplemented")
        );
        assert_eq!(
            code(Method::GET, Resource::Object, "retention", &[]),
            Some("InvalidRequest")
        );
        assert_eq!(
            code(Method::GET, Resource::Object, "legal-hold", &[]),
            Some("InvalidRequest")
        );
        assert_eq!(
            code(Method::PUT, Resource::Object, "retention", &[]),
            Some("NotImplemented")
        );
        assert_eq!(
            code(Method::PUT, Resource::Object, "legal-hold", &[]),
            Some("NotImplemented")
        );
    }

    #[test]
    fn subresources() {
        let absent = [
            (
                "encryption",
                "ServerSideEncryptionConfigurationNotFoundError",
            ),
            ("policy", "NoSuchBucketPolicy"),
            ("replication", "ReplicationConfigurationNotFoundError"),
            ("website", "NoSuchWebsiteConfiguration"),
            ("publicAccessBlock", "NoSuchPublicAccessBlockConfiguration"),
        ];
        for (sub, answer) in absent {
            let r = check(&Method::GET, Resource::Bucket, Some(sub), &HeaderMap::new()).unwrap();
            assert_eq!((r.code(), r.status()), (answer, StatusCode::NOT_FOUND));
            assert_eq!(r.bucket_check(), BucketCheck::Owner);
            for m in [Method::PUT, Method::DELETE, Method::POST] {
                assert_eq!(code(m, Resource::Bucket, sub, &[]), Some("NotImplemented"));
            }
        }
        for sub in [
            "notification",
            "logging",
            "accelerate",
            "requestPayment",
            "inventory&id=a",
            "analytics&id=a",
            "metrics&id=a",
            "intelligent-tiering&id=a",
            "ownershipControls",
            "policyStatus",
        ] {
            for m in [Method::PUT, Method::DELETE] {
                assert_eq!(
                    code(m, Resource::Bucket, sub, &[]),
                    Some("NotImplemented"),
                    "{sub}"
                );
            }
        }
        for sub in [
            "torrent",
            "attributes",
            "restore",
            "select&select-type=2",
            "renameObject",
        ] {
            let m = if sub == "torrent" || sub == "attributes" {
                Method::GET
            } else {
                Method::POST
            };
            assert_eq!(
                code(m, Resource::Object, sub, &[]),
                Some("NotImplemented"),
                "{sub}"
            );
        }
        // an unknown subresource never falls through to the plain operation
        assert_eq!(
            code(Method::GET, Resource::Bucket, "bogus", &[]),
            Some("NotImplemented")
        );
        assert_eq!(
            code(Method::PUT, Resource::Object, "bogus", &[]),
            Some("NotImplemented")
        );
        assert_eq!(
            code(Method::DELETE, Resource::Object, "bogus=", &[]),
            Some("NotImplemented")
        );
        assert_eq!(
            code(Method::DELETE, Resource::Bucket, "bogus", &[]),
            Some("NotImplemented")
        );
    }

    #[test]
    fn headers_of_other_features() {
        assert_eq!(
            put(&[("x-amz-storage-class", "GLACIER")]),
            Some("InvalidStorageClass")
        );
        assert_eq!(
            put(&[("x-amz-storage-class", "BOGUS")]),
            Some("InvalidStorageClass")
        );
        assert_eq!(
            code(
                Method::POST,
                Resource::Object,
                "uploads",
                &[("x-amz-storage-class", "STANDARD_IA")]
            ),
            Some("InvalidStorageClass")
        );
        assert_eq!(
            put(&[("x-amz-website-redirect-location", "/x")]),
            Some("NotImplemented")
        );
        assert_eq!(put(&[("x-amz-grant-read", "id=x")]), Some("NotImplemented"));
        assert_eq!(
            code(
                Method::PUT,
                Resource::Bucket,
                "",
                &[("x-amz-grant-write", "id=x")]
            ),
            Some("NotImplemented")
        );
        assert_eq!(
            put(&[("x-amz-request-payer", "bogus")]),
            Some("InvalidArgument")
        );
        assert_eq!(
            code(
                Method::DELETE,
                Resource::Object,
                "",
                &[("x-amz-mfa", "a b")]
            ),
            Some("NotImplemented")
        );
        assert_eq!(
            put(&[("x-amz-write-offset-bytes", "0")]),
            Some("NotImplemented")
        );
        let copy = ("x-amz-copy-source", "/b/k");
        assert_eq!(
            put(&[copy, ("x-amz-metadata-directive", "BOGUS")]),
            Some("InvalidArgument")
        );
        assert_eq!(
            put(&[copy, ("x-amz-tagging-directive", "copy")]),
            Some("InvalidArgument")
        );
        assert_eq!(put(&[copy, ("x-amz-metadata-directive", "REPLACE")]), None);
    }

    #[test]
    fn conditional_writes() {
        assert_eq!(put(&[("if-none-match", "*")]), None);
        assert_eq!(put(&[("if-match", "\"abc\"")]), None);
        assert_eq!(put(&[("if-none-match", "\"abc\"")]), Some("NotImplemented"));
        let complete = |h| code(Method::POST, Resource::Object, "uploadId=u", &[h]);
        assert_eq!(complete(("if-none-match", "*")), None);
        assert_eq!(complete(("if-match", "\"e\"")), None);
        assert_eq!(complete(("if-none-match", "\"e\"")), Some("NotImplemented"));
        assert_eq!(
            code(
                Method::PUT,
                Resource::Object,
                "partNumber=1&uploadId=u",
                &[("if-none-match", "*")]
            ),
            Some("NotImplemented")
        );
        assert_eq!(
            put(&[("x-amz-copy-source", "/b/k"), ("if-none-match", "*")]),
            None
        );
        // reads keep their conditions
        assert_eq!(
            code(
                Method::GET,
                Resource::Object,
                "",
                &[("if-none-match", "\"e\"")]
            ),
            None
        );
    }

    #[test]
    fn checksum_shapes() {
        // what boto3 and the aws CLI send by default
        assert_eq!(
            put(&[
                ("x-amz-sdk-checksum-algorithm", "CRC32"),
                ("x-amz-checksum-crc32", "AAAAAA==")
            ]),
            None
        );
        assert_eq!(
            put(&[
                ("x-amz-sdk-checksum-algorithm", "CRC32"),
                ("x-amz-trailer", "x-amz-checksum-crc32"),
                ("content-encoding", "aws-chunked"),
            ]),
            None
        );
        assert_eq!(
            code(
                Method::POST,
                Resource::Object,
                "uploads",
                &[("x-amz-checksum-algorithm", "CRC32")]
            ),
            None
        );
        assert_eq!(
            code(
                Method::GET,
                Resource::Object,
                "",
                &[("x-amz-checksum-mode", "ENABLED")]
            ),
            None
        );
        for alg in CHECKSUMS {
            let name = format!("x-amz-checksum-{alg}");
            assert_eq!(put(&[(&name, "x")]), None);
        }
        // the algorithm without its checksum: nothing would be verified
        assert_eq!(
            put(&[("x-amz-sdk-checksum-algorithm", "CRC32")]),
            Some("InvalidRequest")
        );
        assert_eq!(
            put(&[
                ("x-amz-sdk-checksum-algorithm", "SHA256"),
                ("x-amz-checksum-crc32", "x")
            ]),
            Some("InvalidRequest")
        );
        assert_eq!(
            put(&[
                ("x-amz-sdk-checksum-algorithm", "MD5"),
                ("x-amz-checksum-md5", "x")
            ]),
            Some("NotImplemented")
        );
        assert_eq!(
            put(&[("x-amz-checksum-xxhash64", "x")]),
            Some("NotImplemented")
        );
        assert_eq!(
            put(&[
                ("x-amz-checksum-crc32", "x"),
                ("x-amz-checksum-sha256", "y")
            ]),
            Some("InvalidRequest")
        );
        assert_eq!(
            put(&[("x-amz-trailer", "x-amz-checksum-bogus")]),
            Some("InvalidRequest")
        );
        assert_eq!(
            put(&[("x-amz-trailer", "x-amz-meta-a")]),
            Some("InvalidRequest")
        );
        assert_eq!(
            put(&[
                ("x-amz-trailer", "x-amz-checksum-crc32"),
                ("x-amz-checksum-crc32", "x")
            ]),
            Some("InvalidRequest")
        );
        assert_eq!(
            code(
                Method::POST,
                Resource::Object,
                "uploads",
                &[("x-amz-checksum-algorithm", "MD5")]
            ),
            Some("InvalidRequest")
        );
        assert_eq!(
            code(
                Method::POST,
                Resource::Object,
                "uploads",
                &[("x-amz-checksum-type", "FULL_OBJECT")]
            ),
            Some("NotImplemented")
        );
        assert_eq!(
            code(
                Method::POST,
                Resource::Object,
                "uploadId=u",
                &[("x-amz-checksum-crc32", "x")]
            ),
            Some("NotImplemented")
        );
        assert_eq!(
            put(&[("x-amz-copy-source", "/b/k"), ("x-amz-checksum-crc32", "x")]),
            Some("InvalidRequest")
        );
        // a document's checksum is verified whole by the front end; aws-chunked ones are not read
        assert_eq!(
            code(
                Method::PUT,
                Resource::Bucket,
                "tagging",
                &[("x-amz-checksum-crc32", "x")]
            ),
            None
        );
        assert_eq!(
            code(
                Method::PUT,
                Resource::Bucket,
                "tagging",
                &[
                    ("x-amz-checksum-crc32", "x"),
                    ("content-encoding", "aws-chunked")
                ]
            ),
            Some("NotImplemented")
        );
        assert_eq!(
            code(
                Method::PUT,
                Resource::Bucket,
                "tagging",
                &[("x-amz-trailer", "x-amz-checksum-crc32")]
            ),
            Some("NotImplemented")
        );
    }

    #[test]
    fn which_bodies_are_object_data() {
        let h = HeaderMap::new();
        assert!(carries_object_data(
            &Method::PUT,
            Resource::Object,
            None,
            &h
        ));
        assert!(carries_object_data(
            &Method::PUT,
            Resource::Object,
            Some("partNumber=1&uploadId=u"),
            &h
        ));
        assert!(carries_object_data(
            &Method::POST,
            Resource::Bucket,
            None,
            &h
        ));
        assert!(!carries_object_data(
            &Method::POST,
            Resource::Bucket,
            Some("delete"),
            &h
        ));
        assert!(!carries_object_data(
            &Method::PUT,
            Resource::Object,
            Some("tagging"),
            &h
        ));
        assert!(!carries_object_data(
            &Method::PUT,
            Resource::Bucket,
            Some("lifecycle"),
            &h
        ));
        assert!(!carries_object_data(
            &Method::POST,
            Resource::Object,
            Some("uploadId=u"),
            &h
        ));
    }

    #[test]
    fn documents_are_verified() {
        let body = b"<Tagging><TagSet/></Tagging>";
        let mut crc = s3s::checksum::ChecksumHasher {
            crc32: Some(Default::default()),
            ..Default::default()
        };
        crc.update(body);
        let good = crc.finalize().checksum_crc32.unwrap();
        let h = headers(&[("x-amz-checksum-crc32", &good)]);
        assert_eq!(verify_document(&document_checks(&h), body), Ok(()));
        let h = headers(&[("x-amz-checksum-crc32", "AAAAAA==")]);
        assert_eq!(
            verify_document(&document_checks(&h), body).map_err(|e| e.0),
            Err(S3ErrorCode::BadDigest)
        );
        let h = headers(&[("content-md5", "1B2M2Y8AsgTpgAmY7PhCfg==")]); // md5 of nothing
        assert_eq!(verify_document(&document_checks(&h), b""), Ok(()));
        assert_eq!(
            verify_document(&document_checks(&h), body).map_err(|e| e.0),
            Err(S3ErrorCode::BadDigest)
        );
        let h = headers(&[("content-md5", "nope")]);
        assert_eq!(
            verify_document(&document_checks(&h), body).map_err(|e| e.0),
            Err(S3ErrorCode::InvalidDigest)
        );
    }

    #[test]
    fn lifecycle_documents() {
        let ok = br#"<?xml version="1.0" encoding="UTF-8"?><LifecycleConfiguration xmlns="http://s3.amazonaws.com/doc/2006-03-01/"><Rule><ID>a</ID><Filter><Prefix>x/</Prefix></Filter><Status>Enabled</Status><Expiration><Days>1</Days></Expiration></Rule></LifecycleConfiguration>"#;
        assert_eq!(check_lifecycle(ok), None);
        let bad = br#"<LifecycleConfiguration><Rule><ID>a</ID><Status>Enabled</Status><Filter/><Expiration><Days>1</Days></Expiration><Archive><Days>3</Days></Archive></Rule></LifecycleConfiguration>"#;
        assert_eq!(check_lifecycle(bad).map(|r| r.code()), Some("MalformedXML"));
        let bad = br#"<LifecycleConfiguration><Rule><Filter><ObjectSizeGreaterThanOrEqual>1</ObjectSizeGreaterThanOrEqual></Filter></Rule></LifecycleConfiguration>"#;
        assert_eq!(check_lifecycle(bad).map(|r| r.code()), Some("MalformedXML"));
    }

    #[test]
    fn refusals_become_s3_errors() {
        let e: S3Error = Refusal::NoConfiguration {
            code: "NoSuchPublicAccessBlockConfiguration",
            what: "public access block configuration",
        }
        .into();
        assert_eq!(e.code().as_str(), "NoSuchPublicAccessBlockConfiguration");
        assert_eq!(e.status_code(), Some(StatusCode::NOT_FOUND));
        let e: S3Error = Refusal::InvalidStorageClass("GLACIER".into()).into();
        assert_eq!(*e.code(), S3ErrorCode::InvalidStorageClass);
        assert_eq!(e.status_code(), Some(StatusCode::BAD_REQUEST));
    }
}
