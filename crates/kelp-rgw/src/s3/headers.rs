//! Pure helpers of the S3 front end: times, ETags and conditional requests, keys, tags,
//! metadata from headers, listing tokens and ranges, and the checks on object bodies as they
//! stream (`BodyChecks`). No storage access: unit-tested here.

use super::*;

pub(super) fn ts(ns: u64) -> Timestamp {
    Timestamp::from(UNIX_EPOCH + Duration::from_nanos(ns))
}

/// Seconds, as HTTP dates carry them.
pub(super) fn secs(t: &Timestamp) -> i64 {
    let t: time::OffsetDateTime = t.clone().into();
    t.unix_timestamp()
}

pub(super) fn etag(e: &str) -> ETag {
    ETag::Strong(e.to_string())
}

pub(super) fn etag_matches(cond: &ETagCondition, current: &str) -> bool {
    match cond {
        ETagCondition::Any => true,
        ETagCondition::ETag(t) => t.value() == current,
    }
}

/// GET/HEAD preconditions in RFC 7232 order.
pub(super) fn check_read_conditions(
    e: &IndexEntry,
    if_match: &Option<ETagCondition>,
    if_none_match: &Option<ETagCondition>,
    if_modified_since: &Option<Timestamp>,
    if_unmodified_since: &Option<Timestamp>,
) -> S3Result<()> {
    let mtime = (e.mtime_ns / 1_000_000_000) as i64;
    if let Some(c) = if_match {
        if !etag_matches(c, &e.etag) {
            return Err(s3_error!(PreconditionFailed, "If-Match does not hold"));
        }
    } else if let Some(t) = if_unmodified_since
        && mtime > secs(t)
    {
        return Err(s3_error!(
            PreconditionFailed,
            "modified since If-Unmodified-Since"
        ));
    }
    if let Some(c) = if_none_match {
        if etag_matches(c, &e.etag) {
            return Err(s3_error!(NotModified));
        }
    } else if let Some(t) = if_modified_since
        && mtime <= secs(t)
    {
        return Err(s3_error!(NotModified));
    }
    Ok(())
}

/// x-amz-copy-source-if-* (failures are 412 for every one of them).
pub(super) fn check_copy_conditions(
    e: &IndexEntry,
    if_match: &Option<ETagCondition>,
    if_none_match: &Option<ETagCondition>,
    if_modified_since: &Option<Timestamp>,
    if_unmodified_since: &Option<Timestamp>,
) -> S3Result<()> {
    check_read_conditions(
        e,
        if_match,
        if_none_match,
        if_modified_since,
        if_unmodified_since,
    )
    .map_err(|err| {
        if *err.code() == S3ErrorCode::NotModified {
            s3_error!(PreconditionFailed, "copy source precondition does not hold")
        } else {
            err
        }
    })
}

pub(super) fn bad_part_number(msg: &str) -> S3Error {
    S3Error::with_message(
        S3ErrorCode::Custom("InvalidPartNumber".into()),
        msg.to_string(),
    )
    .with_status(416)
}

pub(super) fn check_key(key: &str) -> S3Result<()> {
    if key.is_empty() || key.len() > 1024 {
        return Err(s3_error!(
            KeyTooLongError,
            "object keys are 1 to 1024 bytes"
        ));
    }
    Ok(())
}

/// The checksums of `c` by algorithm (`crc32` → base64 value), as a part keeps them.
pub(super) fn checksum_map(c: &Checksum) -> BTreeMap<String, String> {
    [
        ("crc32", &c.checksum_crc32),
        ("crc32c", &c.checksum_crc32c),
        ("sha1", &c.checksum_sha1),
        ("sha256", &c.checksum_sha256),
        ("crc64nvme", &c.checksum_crc64nvme),
    ]
    .into_iter()
    .filter_map(|(a, v)| v.clone().map(|v| (a.to_string(), v)))
    .collect()
}

/// The destination conditions of a write from its `If-Match` / `If-None-Match` headers
/// (other forms of `If-None-Match` were refused before: `crate::unsupported`).
pub(super) fn write_condition(
    if_match: Option<String>,
    if_none_match: Option<&str>,
) -> WriteCondition {
    WriteCondition {
        if_absent: if_none_match.is_some_and(|v| v.trim() == "*"),
        if_etag: if_match.map(|v| v.trim().trim_matches('"').to_string()),
    }
}

/// Content-MD5 and x-amz-checksum-* verification of an uploaded body.
pub(super) struct BodyChecks {
    pub(super) content_md5: Option<String>,
    pub(super) hasher: s3s::checksum::ChecksumHasher,
    pub(super) expected: Checksum,
    pub(super) trailers: Option<s3s::TrailingHeaders>,
    /// The checksum `x-amz-trailer` promised (lowercase header name): it must arrive.
    pub(super) declared_trailer: Option<String>,
    pub(super) computed: Option<Checksum>,
}

impl BodyChecks {
    #[allow(clippy::too_many_arguments)]
    pub(super) fn new(
        content_md5: Option<String>,
        algorithm: Option<&ChecksumAlgorithm>,
        crc32: Option<String>,
        crc32c: Option<String>,
        sha1: Option<String>,
        sha256: Option<String>,
        crc64nvme: Option<String>,
        trailers: Option<s3s::TrailingHeaders>,
    ) -> S3Result<BodyChecks> {
        let mut hasher = s3s::checksum::ChecksumHasher::default();
        let alg = algorithm.map(|a| a.as_str().to_ascii_uppercase());
        if crc32.is_some() || alg.as_deref() == Some("CRC32") {
            hasher.crc32 = Some(Default::default());
        }
        if crc32c.is_some() || alg.as_deref() == Some("CRC32C") {
            hasher.crc32c = Some(Default::default());
        }
        if sha1.is_some() || alg.as_deref() == Some("SHA1") {
            hasher.sha1 = Some(Default::default());
        }
        if sha256.is_some() || alg.as_deref() == Some("SHA256") {
            hasher.sha256 = Some(Default::default());
        }
        if crc64nvme.is_some() || alg.as_deref() == Some("CRC64NVME") {
            hasher.crc64nvme = Some(Default::default());
        }
        if let Some(a) = alg.as_deref()
            && !["CRC32", "CRC32C", "SHA1", "SHA256", "CRC64NVME"].contains(&a)
        {
            return Err(s3_error!(InvalidArgument, "unknown checksum algorithm {a}"));
        }
        Ok(BodyChecks {
            content_md5,
            hasher,
            expected: Checksum {
                checksum_crc32: crc32,
                checksum_crc32c: crc32c,
                checksum_sha1: sha1,
                checksum_sha256: sha256,
                checksum_crc64nvme: crc64nvme,
                ..Default::default()
            },
            trailers,
            declared_trailer: None,
            computed: None,
        })
    }

    /// Requires the trailer `x-amz-trailer` names (if any) to arrive with the body, so that
    /// a checksum promised is never skipped because it did not come.
    pub(super) fn declared_trailer(mut self, headers: &hyper::HeaderMap) -> BodyChecks {
        self.declared_trailer = headers
            .get("x-amz-trailer")
            .and_then(|v| v.to_str().ok())
            .map(|v| v.trim().to_ascii_lowercase());
        match self.declared_trailer.as_deref() {
            Some("x-amz-checksum-crc32") => self.hasher.crc32 = Some(Default::default()),
            Some("x-amz-checksum-crc32c") => self.hasher.crc32c = Some(Default::default()),
            Some("x-amz-checksum-sha1") => self.hasher.sha1 = Some(Default::default()),
            Some("x-amz-checksum-sha256") => self.hasher.sha256 = Some(Default::default()),
            Some("x-amz-checksum-crc64nvme") => self.hasher.crc64nvme = Some(Default::default()),
            // anything else was refused before the body was read (crate::unsupported)
            _ => {}
        }
        self
    }

    pub(super) fn none() -> BodyChecks {
        BodyChecks::new(None, None, None, None, None, None, None, None).expect("no checks")
    }

    pub(super) fn update(&mut self, data: &[u8]) {
        self.hasher.update(data);
    }

    pub(super) fn verify(&mut self, md5: &[u8; 16]) -> S3Result<()> {
        if let Some(want) = &self.content_md5 {
            use base64::Engine;
            let want = base64::engine::general_purpose::STANDARD
                .decode(want)
                .map_err(|_| s3_error!(InvalidDigest, "Content-MD5 is not base64"))?;
            if want.as_slice() != md5 {
                return Err(s3_error!(BadDigest, "the body does not match Content-MD5"));
            }
        }
        let hasher = std::mem::take(&mut self.hasher);
        let mut exp = self.expected.clone();
        let trailers = self.trailers.take().and_then(|t| t.take());
        if let Some(name) = &self.declared_trailer {
            let value = trailers
                .as_ref()
                .and_then(|t| t.get(name.as_str()))
                .and_then(|v| v.to_str().ok());
            if value.is_none() {
                return Err(S3Error::with_message(
                    S3ErrorCode::Custom("MalformedTrailerError".into()),
                    format!("x-amz-trailer names {name} but the body carried no such trailer"),
                )
                .with_status(400));
            }
        }
        let got = hasher.finalize();
        if let Some(t) = trailers {
            let get = |name: &str| {
                t.get(name)
                    .and_then(|v| v.to_str().ok())
                    .map(str::to_string)
            };
            exp.checksum_crc32 = exp.checksum_crc32.or(get("x-amz-checksum-crc32"));
            exp.checksum_crc32c = exp.checksum_crc32c.or(get("x-amz-checksum-crc32c"));
            exp.checksum_sha1 = exp.checksum_sha1.or(get("x-amz-checksum-sha1"));
            exp.checksum_sha256 = exp.checksum_sha256.or(get("x-amz-checksum-sha256"));
            exp.checksum_crc64nvme = exp.checksum_crc64nvme.or(get("x-amz-checksum-crc64nvme"));
        }
        let pairs = [
            ("CRC32", &exp.checksum_crc32, &got.checksum_crc32),
            ("CRC32C", &exp.checksum_crc32c, &got.checksum_crc32c),
            ("SHA1", &exp.checksum_sha1, &got.checksum_sha1),
            ("SHA256", &exp.checksum_sha256, &got.checksum_sha256),
            (
                "CRC64NVME",
                &exp.checksum_crc64nvme,
                &got.checksum_crc64nvme,
            ),
        ];
        for (name, want, have) in pairs {
            if want.is_some() && have.is_none() {
                // a trailer for an algorithm nobody declared: nothing computed it
                return Err(s3_error!(
                    InvalidRequest,
                    "the body carried a {name} checksum that x-amz-trailer did not declare"
                ));
            }
            if let (Some(w), Some(h)) = (want, have)
                && w != h
            {
                return Err(s3_error!(
                    BadDigest,
                    "the body's {name} checksum is {h}, not {w}"
                ));
            }
        }
        self.computed = Some(got);
        Ok(())
    }
}

/// Keys in listings, percent-encoded when the client asked for `EncodingType=url`.
pub(super) struct Enc(pub(super) bool);
impl Enc {
    pub(super) fn new(t: &Option<EncodingType>) -> Enc {
        Enc(t
            .as_ref()
            .is_some_and(|t| t.as_str().eq_ignore_ascii_case("url")))
    }
    pub(super) fn s(&self, v: &str) -> String {
        if !self.0 {
            return v.to_string();
        }
        const KEEP: &percent_encoding::AsciiSet = &percent_encoding::NON_ALPHANUMERIC
            .remove(b'-')
            .remove(b'_')
            .remove(b'.')
            .remove(b'~')
            .remove(b'/');
        percent_encoding::utf8_percent_encode(v, KEEP).to_string()
    }
    pub(super) fn o(&self, v: &Option<String>) -> Option<String> {
        v.as_ref().map(|v| self.s(v))
    }
}

pub(super) fn meta_from_headers(
    content_type: Option<String>,
    content_encoding: Option<String>,
    content_disposition: Option<String>,
    content_language: Option<String>,
    cache_control: Option<String>,
    expires: Option<Timestamp>,
    metadata: Option<Metadata>,
) -> S3Result<ObjectMeta> {
    let user: BTreeMap<String, String> = metadata.unwrap_or_default().into_iter().collect();
    let user_bytes: usize = user.iter().map(|(k, v)| k.len() + v.len()).sum();
    if user_bytes > 2048 {
        return Err(s3_error!(
            MetadataTooLarge,
            "user metadata is limited to 2 KiB"
        ));
    }
    let expires = match expires {
        Some(t) => {
            let mut buf = Vec::new();
            t.format(TimestampFormat::HttpDate, &mut buf)
                .map_err(|_| s3_error!(InvalidArgument, "bad Expires"))?;
            Some(String::from_utf8_lossy(&buf).into_owned())
        }
        None => None,
    };
    Ok(ObjectMeta {
        content_type,
        content_encoding,
        content_disposition,
        content_language,
        cache_control,
        expires,
        user,
        ..ObjectMeta::default()
    })
}

pub(super) fn expires_ts(m: &ObjectMeta) -> Option<Timestamp> {
    m.expires
        .as_deref()
        .and_then(|s| Timestamp::parse(TimestampFormat::HttpDate, s).ok())
}

pub(super) fn user_meta(m: &ObjectMeta) -> Option<Metadata> {
    if m.user.is_empty() {
        None
    } else {
        Some(m.user.clone().into_iter().collect())
    }
}

/// Tags from an `x-amz-tagging` header (`k1=v1&k2=v2`, URL-encoded).
pub(super) fn tags_from_header(h: Option<&str>) -> S3Result<BTreeMap<String, String>> {
    let mut tags = BTreeMap::new();
    let Some(h) = h.filter(|h| !h.is_empty()) else {
        return Ok(tags);
    };
    let dec = |s: &str| {
        percent_encoding::percent_decode_str(&s.replace('+', " "))
            .decode_utf8()
            .map(|c| c.into_owned())
            .map_err(|_| s3_error!(InvalidTag, "x-amz-tagging is not valid UTF-8"))
    };
    for pair in h.split('&') {
        let (k, v) = pair.split_once('=').unwrap_or((pair, ""));
        if tags.insert(dec(k)?, dec(v)?).is_some() {
            return Err(s3_error!(InvalidTag, "a tag key appears twice"));
        }
    }
    check_tags(&tags, 10).map_err(|m| s3_error!(InvalidTag, "{m}"))?;
    Ok(tags)
}

pub(super) fn tags_from_set(set: Vec<Tag>, max: usize) -> S3Result<BTreeMap<String, String>> {
    let mut tags = BTreeMap::new();
    for t in set {
        let k = t.key.unwrap_or_default();
        if tags
            .insert(k.clone(), t.value.unwrap_or_default())
            .is_some()
        {
            return Err(s3_error!(InvalidTag, "tag key '{k}' appears twice"));
        }
    }
    check_tags(&tags, max).map_err(|m| s3_error!(InvalidTag, "{m}"))?;
    Ok(tags)
}

pub(super) fn tag_set(tags: &BTreeMap<String, String>) -> Vec<Tag> {
    tags.iter()
        .map(|(k, v)| Tag {
            key: Some(k.clone()),
            value: Some(v.clone()),
        })
        .collect()
}

pub(super) fn tag_count(m: &ObjectMeta) -> Option<i32> {
    (!m.tags.is_empty()).then_some(m.tags.len() as i32)
}

pub(super) fn max_keys(v: Option<i32>) -> S3Result<usize> {
    match v {
        None => Ok(1000),
        Some(n) if n < 0 => Err(s3_error!(InvalidArgument, "max-keys must not be negative")),
        Some(n) => Ok((n as usize).min(1000)),
    }
}

pub(super) fn token_encode(marker: &str) -> String {
    use base64::Engine;
    base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(marker)
}

pub(super) fn token_decode(token: &str) -> S3Result<String> {
    use base64::Engine;
    base64::engine::general_purpose::URL_SAFE_NO_PAD
        .decode(token)
        .ok()
        .and_then(|v| String::from_utf8(v).ok())
        .ok_or_else(|| s3_error!(InvalidArgument, "the continuation token is not valid"))
}

/// Bytes `[first, last]` of a `bytes=first-last` copy-source range.
pub(super) fn parse_copy_range(r: &str, size: u64) -> S3Result<(u64, u64)> {
    let bad = || {
        s3_error!(
            InvalidArgument,
            "x-amz-copy-source-range must look like bytes=first-last"
        )
    };
    let spec = r.strip_prefix("bytes=").ok_or_else(bad)?;
    let (a, b) = spec.split_once('-').ok_or_else(bad)?;
    let (a, b): (u64, u64) = (a.parse().map_err(|_| bad())?, b.parse().map_err(|_| bad())?);
    if a > b || b >= size {
        return Err(s3_error!(
            InvalidRange,
            "range {a}-{b} is outside the {size}-byte source"
        ));
    }
    Ok((a, b + 1))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn code(e: S3Error) -> String {
        e.code().as_str().to_string()
    }

    #[test]
    fn copy_ranges_are_inclusive_and_inside_the_source() {
        assert_eq!(parse_copy_range("bytes=0-9", 10).unwrap(), (0, 10));
        assert_eq!(parse_copy_range("bytes=5-5", 10).unwrap(), (5, 6));
        assert_eq!(
            code(parse_copy_range("bytes=0-10", 10).unwrap_err()),
            "InvalidRange"
        );
        assert_eq!(
            code(parse_copy_range("bytes=7-3", 10).unwrap_err()),
            "InvalidRange"
        );
        for bad in ["0-9", "bytes=0", "bytes=a-9", "bytes=-5", "items=0-1"] {
            assert_eq!(
                code(parse_copy_range(bad, 10).unwrap_err()),
                "InvalidArgument",
                "{bad}"
            );
        }
    }

    #[test]
    fn listing_tokens_round_trip_and_garbage_is_refused() {
        for marker in ["", "a", "photos/2026/ü ✓.jpg", "x\u{0}y"] {
            assert_eq!(token_decode(&token_encode(marker)).unwrap(), marker);
        }
        assert_eq!(code(token_decode("***").unwrap_err()), "InvalidArgument");
        assert_eq!(max_keys(None).unwrap(), 1000);
        assert_eq!(max_keys(Some(5)).unwrap(), 5);
        assert_eq!(max_keys(Some(5000)).unwrap(), 1000, "capped as AWS does");
        assert!(max_keys(Some(-1)).is_err());
    }

    #[test]
    fn keys_tags_and_etag_conditions() {
        assert!(check_key("a").is_ok());
        assert!(check_key(&"k".repeat(1024)).is_ok());
        assert_eq!(code(check_key("").unwrap_err()), "KeyTooLongError");
        assert_eq!(
            code(check_key(&"k".repeat(1025)).unwrap_err()),
            "KeyTooLongError"
        );

        let t = tags_from_header(Some("a=1&b=two+words&c%2Fd=%C3%BC")).unwrap();
        assert_eq!(t.get("a").map(String::as_str), Some("1"));
        assert_eq!(t.get("b").map(String::as_str), Some("two words"));
        assert_eq!(t.get("c/d").map(String::as_str), Some("ü"));
        assert!(tags_from_header(None).unwrap().is_empty());
        assert_eq!(
            code(tags_from_header(Some("a=1&a=2")).unwrap_err()),
            "InvalidTag"
        );
        let eleven: Vec<String> = (0..11).map(|i| format!("k{i}=v")).collect();
        assert_eq!(
            code(tags_from_header(Some(&eleven.join("&"))).unwrap_err()),
            "InvalidTag"
        );
        assert_eq!(tag_set(&t).len(), 3);

        assert!(etag_matches(&ETagCondition::Any, "\"abc\""));
        let e = etag("\"abc\"");
        assert!(etag_matches(&ETagCondition::ETag(e.clone()), e.value()));
        assert!(!etag_matches(&ETagCondition::ETag(e), "\"other\""));
        assert_eq!(secs(&ts(1_500_000_000_000_000_000)), 1_500_000_000);
    }
}
