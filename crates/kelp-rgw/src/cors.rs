//! Bucket CORS configurations (PutBucketCors): validation when stored, and the matching of a
//! browser's request (its `Origin`, method and `Access-Control-Request-Headers`) against the
//! rules, as S3 does it: the first rule whose origin, method and every requested header match
//! answers; no matching rule means no CORS headers (and a 403 for a preflight).
//!
//! Pure: the HTTP front end (`server.rs`) reads the bucket record and turns a match into
//! response headers.

use serde::{Deserialize, Serialize};

/// At most this many rules in one configuration (S3's limit).
pub const MAX_RULES: usize = 100;
/// The methods a rule may allow.
pub const METHODS: [&str; 5] = ["GET", "PUT", "POST", "DELETE", "HEAD"];

/// One CORS rule, as stored in the bucket record.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct CorsRule {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub id: Option<String>,
    pub allowed_origins: Vec<String>,
    pub allowed_methods: Vec<String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub allowed_headers: Vec<String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub expose_headers: Vec<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_age_seconds: Option<i32>,
}

/// Why a CORS configuration is refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum CorsError {
    #[error("a CORS configuration needs at least one rule")]
    NoRules,
    #[error("a CORS configuration has at most {MAX_RULES} rules, not {0}")]
    TooManyRules(usize),
    #[error("Found unsupported HTTP method in CORS config. Unsupported method is {0}")]
    UnsupportedMethod(String),
    #[error("every CORS rule needs at least one AllowedMethod and one AllowedOrigin")]
    EmptyRule,
    #[error("AllowedOrigin \"{0}\" can not have more than one wildcard.")]
    OriginWildcards(String),
    #[error("AllowedHeader \"{0}\" can not have more than one wildcard.")]
    HeaderWildcards(String),
    #[error("MaxAgeSeconds must not be negative")]
    NegativeMaxAge,
    #[error("a rule ID is at most 255 characters")]
    LongId,
}

/// Checks a configuration before it is stored.
pub fn validate(rules: &[CorsRule]) -> Result<(), CorsError> {
    if rules.is_empty() {
        return Err(CorsError::NoRules);
    }
    if rules.len() > MAX_RULES {
        return Err(CorsError::TooManyRules(rules.len()));
    }
    for r in rules {
        if r.allowed_methods.is_empty() || r.allowed_origins.is_empty() {
            return Err(CorsError::EmptyRule);
        }
        if let Some(m) = r
            .allowed_methods
            .iter()
            .find(|m| !METHODS.contains(&m.as_str()))
        {
            return Err(CorsError::UnsupportedMethod(m.clone()));
        }
        if let Some(o) = r
            .allowed_origins
            .iter()
            .find(|o| o.matches('*').count() > 1)
        {
            return Err(CorsError::OriginWildcards(o.clone()));
        }
        if let Some(h) = r
            .allowed_headers
            .iter()
            .find(|h| h.matches('*').count() > 1)
        {
            return Err(CorsError::HeaderWildcards(h.clone()));
        }
        if r.max_age_seconds.is_some_and(|a| a < 0) {
            return Err(CorsError::NegativeMaxAge);
        }
        if r.id.as_ref().is_some_and(|id| id.chars().count() > 255) {
            return Err(CorsError::LongId);
        }
    }
    Ok(())
}

/// `value` against a pattern with at most one `*` (any run of characters), ignoring ASCII case.
fn wildcard_match(pattern: &str, value: &str) -> bool {
    let (p, v) = (pattern.to_ascii_lowercase(), value.to_ascii_lowercase());
    match p.split_once('*') {
        None => p == v,
        Some((head, tail)) => {
            v.len() >= head.len() + tail.len() && v.starts_with(head) && v.ends_with(tail)
        }
    }
}

/// What a matching rule lets the browser see.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CorsMatch<'a> {
    pub rule: &'a CorsRule,
    /// `*` when the rule allows every origin, else the request's origin.
    pub allow_origin: String,
}

impl CorsMatch<'_> {
    /// Response headers for the matched request (without Access-Control-Allow-Headers,
    /// which a preflight adds: it echoes the requested headers).
    pub fn headers(&self) -> Vec<(&'static str, String)> {
        let mut h = vec![
            ("access-control-allow-origin", self.allow_origin.clone()),
            (
                "access-control-allow-methods",
                self.rule.allowed_methods.join(", "),
            ),
        ];
        if self.allow_origin != "*" {
            h.push(("access-control-allow-credentials", "true".into()));
        }
        if !self.rule.expose_headers.is_empty() {
            h.push((
                "access-control-expose-headers",
                self.rule.expose_headers.join(", "),
            ));
        }
        if let Some(age) = self.rule.max_age_seconds {
            h.push(("access-control-max-age", age.to_string()));
        }
        h
    }
}

/// The first rule allowing `origin` to use `method` with the request headers `headers`
/// (the lowercase names a preflight lists in Access-Control-Request-Headers).
pub fn find<'a>(
    rules: &'a [CorsRule],
    origin: &str,
    method: &str,
    headers: &[String],
) -> Option<CorsMatch<'a>> {
    let rule = rules.iter().find(|r| {
        r.allowed_origins.iter().any(|o| wildcard_match(o, origin))
            && r.allowed_methods.iter().any(|m| m == method)
            && headers
                .iter()
                .all(|h| r.allowed_headers.iter().any(|a| wildcard_match(a, h)))
    })?;
    let allow_origin = if rule.allowed_origins.iter().any(|o| o == "*") {
        "*".to_string()
    } else {
        origin.to_string()
    };
    Some(CorsMatch { rule, allow_origin })
}

/// The header names of an `Access-Control-Request-Headers` value, lowercased.
pub fn parse_request_headers(v: &str) -> Vec<String> {
    v.split(',')
        .map(|h| h.trim().to_ascii_lowercase())
        .filter(|h| !h.is_empty())
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rule(origins: &[&str], methods: &[&str], headers: &[&str]) -> CorsRule {
        CorsRule {
            allowed_origins: origins.iter().map(|s| s.to_string()).collect(),
            allowed_methods: methods.iter().map(|s| s.to_string()).collect(),
            allowed_headers: headers.iter().map(|s| s.to_string()).collect(),
            ..Default::default()
        }
    }

    #[test]
    fn validation() {
        assert_eq!(validate(&[]), Err(CorsError::NoRules));
        assert!(validate(&[rule(&["*"], &["GET", "HEAD"], &[])]).is_ok());
        assert_eq!(
            validate(&[rule(&["*"], &["PATCH"], &[])]),
            Err(CorsError::UnsupportedMethod("PATCH".into()))
        );
        assert_eq!(
            validate(&[rule(&["https://*.*.com"], &["GET"], &[])]),
            Err(CorsError::OriginWildcards("https://*.*.com".into()))
        );
        assert_eq!(
            validate(&[rule(&[], &["GET"], &[])]),
            Err(CorsError::EmptyRule)
        );
        let many = vec![rule(&["*"], &["GET"], &[]); MAX_RULES + 1];
        assert_eq!(validate(&many), Err(CorsError::TooManyRules(MAX_RULES + 1)));
        assert!(validate(&many[..MAX_RULES]).is_ok());
    }

    #[test]
    fn matching() {
        let rules = vec![
            rule(
                &["https://*.example.com"],
                &["PUT", "POST"],
                &["x-amz-*", "content-type"],
            ),
            rule(&["*"], &["GET"], &[]),
        ];
        let m = find(
            &rules,
            "https://app.example.com",
            "PUT",
            &["content-type".into()],
        )
        .expect("first rule");
        assert_eq!(m.allow_origin, "https://app.example.com");
        assert!(
            m.headers()
                .contains(&("access-control-allow-credentials", "true".into()))
        );
        assert!(
            find(
                &rules,
                "https://app.example.com",
                "PUT",
                &["x-amz-meta-a".into()]
            )
            .is_some()
        );
        // a header no rule allows
        assert!(
            find(
                &rules,
                "https://app.example.com",
                "PUT",
                &["authorization".into()]
            )
            .is_none()
        );
        // wrong origin for PUT; GET is open to all
        assert!(find(&rules, "https://evil.com", "PUT", &[]).is_none());
        let any = find(&rules, "https://evil.com", "GET", &[]).expect("second rule");
        assert_eq!(any.allow_origin, "*");
        assert!(find(&rules, "https://evil.com", "GET", &["x-custom".into()]).is_none());
        // the wildcard needs the suffix and prefix around it, ignoring case
        assert!(find(&rules, "https://EXAMPLE.com", "PUT", &[]).is_none());
        assert!(find(&rules, "HTTPS://A.Example.com", "PUT", &[]).is_some());
        assert_eq!(
            parse_request_headers("Content-Type, X-Amz-Date,,"),
            vec!["content-type", "x-amz-date"]
        );
    }
}
