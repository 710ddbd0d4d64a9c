//! AWS Signature Version 4, header flavour, for the handful of requests the benchmark sends.
//!
//! A small signer of our own rather than the AWS SDK: the benchmark needs only "sign these
//! headers and this payload hash", and the SDK's dependency tree would dominate the build. The
//! tests check it against AWS's published test-suite signatures and the S3 documentation's
//! worked examples, so a drift from the specification cannot go unnoticed.
//!
//! Hot path: `authorization` runs once per request. It does four small HMACs for the signing key
//! plus two for the request; the payload hash is computed by the caller once per distinct body
//! (see `Payload` in `client.rs`), never per request.

use std::fmt::Write as _;
use std::time::{SystemTime, UNIX_EPOCH};

use hmac::{Hmac, Mac};
use sha2::{Digest, Sha256};

/// Hex SHA-256 of the empty string: the payload hash of every request without a body.
pub const EMPTY_SHA256: &str = "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855";

const ALGORITHM: &str = "AWS4-HMAC-SHA256";

/// Lower-case hex of `bytes`.
pub fn hex(bytes: &[u8]) -> String {
    let mut s = String::with_capacity(bytes.len() * 2);
    for b in bytes {
        // Writing to a String cannot fail.
        let _ = write!(s, "{b:02x}");
    }
    s
}

/// Lower-case hex SHA-256 of `data`.
pub fn sha256_hex(data: &[u8]) -> String {
    hex(&Sha256::digest(data))
}

fn hmac_sha256(key: &[u8], data: &[u8]) -> [u8; 32] {
    // HMAC accepts keys of any length, so `new_from_slice` cannot fail here.
    let mut mac = <Hmac<Sha256> as Mac>::new_from_slice(key).expect("HMAC takes any key length");
    mac.update(data);
    mac.finalize().into_bytes().into()
}

/// Percent-encodes `s` the way SigV4 canonical requests want it: the unreserved characters
/// `A-Z a-z 0-9 - _ . ~` stay, every other byte becomes `%XX` (upper-case hex). `/` stays when
/// `encode_slash` is false (object keys in a path), and is encoded in query names and values.
pub fn uri_encode(s: &str, encode_slash: bool) -> String {
    let mut out = String::with_capacity(s.len());
    for &b in s.as_bytes() {
        match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' => {
                out.push(b as char)
            }
            b'/' if !encode_slash => out.push('/'),
            _ => {
                let _ = write!(out, "%{b:02X}");
            }
        }
    }
    out
}

/// The canonical query string: names and values encoded, pairs sorted by name then value.
pub fn canonical_query(pairs: &[(&str, &str)]) -> String {
    let mut enc: Vec<(String, String)> = pairs
        .iter()
        .map(|(k, v)| (uri_encode(k, true), uri_encode(v, true)))
        .collect();
    enc.sort();
    enc.iter()
        .map(|(k, v)| format!("{k}={v}"))
        .collect::<Vec<_>>()
        .join("&")
}

/// `SystemTime` as SigV4's `X-Amz-Date` (`YYYYMMDD'T'HHMMSS'Z'`, UTC).
pub fn amz_date(t: SystemTime) -> String {
    let secs = t.duration_since(UNIX_EPOCH).map_or(0, |d| d.as_secs());
    let (days, rem) = (secs / 86_400, secs % 86_400);
    let (y, m, d) = civil_from_days(days as i64);
    format!(
        "{y:04}{m:02}{d:02}T{:02}{:02}{:02}Z",
        rem / 3600,
        rem % 3600 / 60,
        rem % 60
    )
}

/// Days since 1970-01-01 to a proleptic Gregorian (year, month, day): Howard Hinnant's
/// `civil_from_days`, exact for every date a clock can show.
fn civil_from_days(z: i64) -> (i64, u32, u32) {
    let z = z + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let y = yoe + era * 400;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = (doy - (153 * mp + 2) / 5 + 1) as u32;
    let m = if mp < 10 { mp + 3 } else { mp - 9 } as u32;
    (if m <= 2 { y + 1 } else { y }, m, d)
}

/// Credentials and scope for one endpoint: signs requests for `service` in `region`.
#[derive(Clone)]
pub struct Signer {
    access_key: String,
    secret_key: String,
    region: String,
    service: String,
}

impl std::fmt::Debug for Signer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // Never print the secret key.
        f.debug_struct("Signer")
            .field("access_key", &self.access_key)
            .field("region", &self.region)
            .field("service", &self.service)
            .finish_non_exhaustive()
    }
}

/// One request as SigV4 sees it. `canonical_uri` is the path exactly as sent (already
/// percent-encoded; S3 does not encode it a second time), `canonical_query` comes from
/// [`canonical_query`], `headers` are the headers to sign (any case; `host` and `x-amz-date`
/// must be among them), `payload_hash` is the hex SHA-256 of the body or `UNSIGNED-PAYLOAD`.
#[derive(Debug, Clone, Copy)]
pub struct Request<'a> {
    pub method: &'a str,
    pub canonical_uri: &'a str,
    pub canonical_query: &'a str,
    pub headers: &'a [(&'a str, &'a str)],
    pub payload_hash: &'a str,
    pub amz_date: &'a str,
}

impl Signer {
    pub fn new(access_key: &str, secret_key: &str, region: &str, service: &str) -> Self {
        Signer {
            access_key: access_key.to_owned(),
            secret_key: secret_key.to_owned(),
            region: region.to_owned(),
            service: service.to_owned(),
        }
    }

    /// The canonical request and the `SignedHeaders` list for `req`.
    pub fn canonical_request(req: &Request<'_>) -> (String, String) {
        let mut headers: Vec<(String, String)> = req
            .headers
            .iter()
            .map(|(k, v)| {
                // Trim and collapse runs of spaces, as the specification requires.
                let v = v.split_whitespace().collect::<Vec<_>>().join(" ");
                (k.to_ascii_lowercase(), v)
            })
            .collect();
        headers.sort_by(|a, b| a.0.cmp(&b.0));
        // Repeated header names are signed once, their values joined by commas in order.
        let mut merged: Vec<(String, String)> = Vec::with_capacity(headers.len());
        for (k, v) in headers {
            match merged.last_mut() {
                Some((lk, lv)) if *lk == k => {
                    lv.push(',');
                    lv.push_str(&v);
                }
                _ => merged.push((k, v)),
            }
        }
        let mut canonical_headers = String::new();
        for (k, v) in &merged {
            canonical_headers.push_str(k);
            canonical_headers.push(':');
            canonical_headers.push_str(v);
            canonical_headers.push('\n');
        }
        let signed = merged
            .iter()
            .map(|(k, _)| k.as_str())
            .collect::<Vec<_>>()
            .join(";");
        let creq = format!(
            "{}\n{}\n{}\n{}\n{}\n{}",
            req.method,
            req.canonical_uri,
            req.canonical_query,
            canonical_headers,
            signed,
            req.payload_hash
        );
        (creq, signed)
    }

    fn scope(&self, date: &str) -> String {
        format!("{date}/{}/{}/aws4_request", self.region, self.service)
    }

    /// The string to sign for a canonical request made at `amz_date`.
    pub fn string_to_sign(&self, amz_date: &str, canonical_request: &str) -> String {
        let date = amz_date.get(..8).unwrap_or(amz_date);
        format!(
            "{ALGORITHM}\n{amz_date}\n{}\n{}",
            self.scope(date),
            sha256_hex(canonical_request.as_bytes())
        )
    }

    fn signing_key(&self, date: &str) -> [u8; 32] {
        let k_date = hmac_sha256(
            format!("AWS4{}", self.secret_key).as_bytes(),
            date.as_bytes(),
        );
        let k_region = hmac_sha256(&k_date, self.region.as_bytes());
        let k_service = hmac_sha256(&k_region, self.service.as_bytes());
        hmac_sha256(&k_service, b"aws4_request")
    }

    /// The value of the `Authorization` header for `req`.
    pub fn authorization(&self, req: &Request<'_>) -> String {
        let (creq, signed) = Self::canonical_request(req);
        let sts = self.string_to_sign(req.amz_date, &creq);
        let date = req.amz_date.get(..8).unwrap_or(req.amz_date);
        let signature = hex(&hmac_sha256(&self.signing_key(date), sts.as_bytes()));
        format!(
            "{ALGORITHM} Credential={}/{}, SignedHeaders={signed}, Signature={signature}",
            self.access_key,
            self.scope(date)
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    // AWS's SigV4 test suite (aws-sig-v4-test-suite): these credentials, region and service,
    // at 2015-08-30T12:36:00Z.
    const SUITE_AK: &str = "AKIDEXAMPLE";
    const SUITE_SK: &str = "wJalrXUtnFEMI/K7MDENG+bPxRfiCYEXAMPLEKEY";
    const SUITE_DATE: &str = "20150830T123600Z";

    fn suite_sign(method: &str, query: &str, extra: &[(&str, &str)], payload: &[u8]) -> String {
        let signer = Signer::new(SUITE_AK, SUITE_SK, "us-east-1", "service");
        let mut headers = vec![
            ("Host", "example.amazonaws.com"),
            ("X-Amz-Date", SUITE_DATE),
        ];
        headers.extend_from_slice(extra);
        let hash = sha256_hex(payload);
        signer.authorization(&Request {
            method,
            canonical_uri: "/",
            canonical_query: query,
            headers: &headers,
            payload_hash: &hash,
            amz_date: SUITE_DATE,
        })
    }

    #[test]
    fn get_vanilla_matches_the_aws_test_suite() {
        assert_eq!(
            suite_sign("GET", "", &[], b""),
            "AWS4-HMAC-SHA256 Credential=AKIDEXAMPLE/20150830/us-east-1/service/aws4_request, \
             SignedHeaders=host;x-amz-date, \
             Signature=5fa00fa31553b73ebf1942676e86291e8372ff2a2260956d9b8aae1d763fbf31"
        );
    }

    #[test]
    fn get_vanilla_query_order_key_case_matches_the_aws_test_suite() {
        // The request says `?Param2=value2&Param1=value1`; canonicalisation sorts it.
        let q = canonical_query(&[("Param2", "value2"), ("Param1", "value1")]);
        assert_eq!(q, "Param1=value1&Param2=value2");
        assert!(suite_sign("GET", &q, &[], b"").ends_with(
            "Signature=b97d918cfa904a5beff61c982a1b6f458b799221646efd99d3219ec94cdf2500"
        ));
    }

    #[test]
    fn post_vanilla_matches_the_aws_test_suite() {
        assert!(suite_sign("POST", "", &[], b"").ends_with(
            "Signature=5da7c1a2acd57cee7505fc6676e4e544621c30862966e37dddb68e92efbe5d6b"
        ));
    }

    // The worked example "GET Object" from the S3 API reference (sig-v4-header-based-auth):
    // the first 10 bytes of examplebucket/test.txt, empty payload hash, 2013-05-24.
    #[test]
    fn s3_get_object_example_matches_the_documentation() {
        let signer = Signer::new(
            "AKIAIOSFODNN7EXAMPLE",
            "wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY",
            "us-east-1",
            "s3",
        );
        let req = Request {
            method: "GET",
            canonical_uri: "/test.txt",
            canonical_query: "",
            headers: &[
                ("Host", "examplebucket.s3.amazonaws.com"),
                ("Range", "bytes=0-9"),
                ("x-amz-content-sha256", EMPTY_SHA256),
                ("x-amz-date", "20130524T000000Z"),
            ],
            payload_hash: EMPTY_SHA256,
            amz_date: "20130524T000000Z",
        };
        let (creq, signed) = Signer::canonical_request(&req);
        assert_eq!(signed, "host;range;x-amz-content-sha256;x-amz-date");
        assert_eq!(
            sha256_hex(creq.as_bytes()),
            "7344ae5b7ee6c3e7e6b0fe0640412a37625d1fbfff95c48bbb2dc43964946972"
        );
        assert_eq!(
            signer.authorization(&req),
            "AWS4-HMAC-SHA256 Credential=AKIAIOSFODNN7EXAMPLE/20130524/us-east-1/s3/aws4_request, \
             SignedHeaders=host;range;x-amz-content-sha256;x-amz-date, \
             Signature=f0e8bdb87c964420e857bd35b5d6ed310bd44f0170aba48dd91039c6036bdb41"
        );
    }

    // What botocore 1.43 (boto3's signer, S3SigV4Auth) produced for a path-style PUT with a
    // signed payload and a key that needs percent-encoding: the request shape this crate sends.
    #[test]
    fn s3_put_matches_botocore() {
        let body = b"hello kelp".repeat(100);
        let hash = sha256_hex(&body);
        assert_eq!(
            hash,
            "8f16897a58000fa561162a5404231e02ab26fdd4ea41bc1ee1035583791fd464"
        );
        let path = format!("/bench-bucket/{}", uri_encode("s3bench/a b/é-1", false));
        assert_eq!(path, "/bench-bucket/s3bench/a%20b/%C3%A9-1");
        let date = "20261122T063106Z";
        let signer = Signer::new("kelpbench", "s3cr3t/key+test", "us-east-1", "s3");
        let auth = signer.authorization(&Request {
            method: "PUT",
            canonical_uri: &path,
            canonical_query: "",
            headers: &[
                ("host", "127.0.0.1:7480"),
                ("x-amz-content-sha256", &hash),
                ("x-amz-date", date),
            ],
            payload_hash: &hash,
            amz_date: date,
        });
        assert_eq!(
            auth,
            "AWS4-HMAC-SHA256 Credential=kelpbench/20261122/us-east-1/s3/aws4_request, \
             SignedHeaders=host;x-amz-content-sha256;x-amz-date, \
             Signature=20f579575a7ce6596218d6eb85ecb5fc840afce62d8056c4034ba50b144ceae5"
        );
    }

    #[test]
    fn header_values_are_trimmed_and_repeated_names_merged() {
        let req = Request {
            method: "GET",
            canonical_uri: "/",
            canonical_query: "",
            headers: &[
                ("My-Header1", "  value1  "),
                ("my-header1", "a   b   c"),
                ("Host", "h"),
            ],
            payload_hash: EMPTY_SHA256,
            amz_date: SUITE_DATE,
        };
        let (creq, signed) = Signer::canonical_request(&req);
        assert_eq!(signed, "host;my-header1");
        assert!(
            creq.contains("\nhost:h\nmy-header1:value1,a b c\n"),
            "{creq}"
        );
    }

    #[test]
    fn uri_encoding_keeps_unreserved_and_optionally_slashes() {
        assert_eq!(uri_encode("a/b c+d~e_f.g-h", false), "a/b%20c%2Bd~e_f.g-h");
        assert_eq!(uri_encode("a/b", true), "a%2Fb");
        assert_eq!(uri_encode("é", false), "%C3%A9");
    }

    #[test]
    fn amz_date_formats_utc() {
        assert_eq!(amz_date(UNIX_EPOCH), "19700101T000000Z");
        let t = UNIX_EPOCH + Duration::from_secs(1_440_938_160); // the test suite's instant
        assert_eq!(amz_date(t), SUITE_DATE);
        let leap = UNIX_EPOCH + Duration::from_secs(951_782_400 + 3_661); // 2000-02-29 01:01:01
        assert_eq!(amz_date(leap), "20000229T010101Z");
    }

    #[test]
    fn empty_hash_constant_is_the_hash_of_nothing() {
        assert_eq!(sha256_hex(b""), EMPTY_SHA256);
    }
}
