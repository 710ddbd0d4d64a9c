//! Dashboard users and roles.
//!
//! A user is an auth entity the monitors keep, `dashboard.<role>.<name>`, whose secret is the
//! user's login key (`kelp dashboard ac-user-create NAME --role admin|read-only`). The
//! monitors never accept these entities for a session of their own, so a dashboard key opens
//! the dashboard and nothing else. The manager caches the users; a login with an unknown
//! name or key makes it look again (at most once a second).
//!
//! Credentials travel as `NAME:KEY`, in the `kelp_dashboard` cookie set by `/login` or in an
//! `Authorization: Bearer NAME:KEY` header (scripts).

use std::collections::BTreeMap;

use serde::Serialize;

/// Prefix of the auth entities that are dashboard users.
pub const ENTITY_PREFIX: &str = "dashboard.";
/// The cookie holding `NAME:KEY`.
pub const COOKIE: &str = "kelp_dashboard";

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize)]
pub enum Role {
    #[serde(rename = "read-only")]
    ReadOnly,
    #[serde(rename = "admin")]
    Admin,
}

impl Role {
    pub fn name(self) -> &'static str {
        match self {
            Role::Admin => "admin",
            Role::ReadOnly => "read-only",
        }
    }

    pub fn parse(s: &str) -> Option<Role> {
        match s {
            "admin" => Some(Role::Admin),
            "read-only" => Some(Role::ReadOnly),
            _ => None,
        }
    }
}

/// The auth entity of dashboard user `name` with `role`.
pub fn entity_for(name: &str, role: Role) -> String {
    format!("{ENTITY_PREFIX}{}.{name}", role.name())
}

/// `(role, name)` of a dashboard entity; `None` for any other entity.
pub fn parse_entity(entity: &str) -> Option<(Role, &str)> {
    let rest = entity.strip_prefix(ENTITY_PREFIX)?;
    let (role, name) = rest.split_once('.')?;
    let role = Role::parse(role)?;
    (!name.is_empty()).then_some((role, name))
}

/// Whether `name` may be a dashboard user name (it becomes part of an entity).
pub fn valid_user_name(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= 64
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
}

/// name → (role, key)
#[derive(Debug, Clone, Default)]
pub struct Users {
    users: BTreeMap<String, (Role, String)>,
}

impl Users {
    pub fn insert(&mut self, name: &str, role: Role, key: String) {
        self.users.insert(name.to_string(), (role, key));
    }

    /// Keeps only the users whose entities are in `entities`.
    pub fn retain_entities(&mut self, entities: &[String]) {
        self.users
            .retain(|name, (role, _)| entities.contains(&entity_for(name, *role)));
    }

    pub fn contains(&self, name: &str, role: Role) -> bool {
        self.users.get(name).is_some_and(|(r, _)| *r == role)
    }

    /// The role of `name` if `key` is its key (compared in constant time).
    pub fn check(&self, name: &str, key: &str) -> Option<Role> {
        let (role, want) = self.users.get(name)?;
        constant_time_eq(want.as_bytes(), key.as_bytes()).then_some(*role)
    }

    pub fn len(&self) -> usize {
        self.users.len()
    }

    pub fn is_empty(&self) -> bool {
        self.users.is_empty()
    }
}

fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    if a.len() != b.len() {
        return false;
    }
    a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

/// `NAME:KEY` from a request's `Cookie` or `Authorization` header values.
pub fn credentials(cookie: Option<&str>, authorization: Option<&str>) -> Option<(String, String)> {
    let from_bearer = authorization
        .and_then(|a| a.strip_prefix("Bearer "))
        .map(str::trim);
    let from_cookie = cookie.and_then(|c| {
        c.split(';').find_map(|kv| {
            let (k, v) = kv.trim().split_once('=')?;
            (k == COOKIE).then_some(v)
        })
    });
    let raw = from_bearer.or(from_cookie)?;
    let raw = percent_decode(raw);
    let (name, key) = raw.split_once(':')?;
    Some((name.to_string(), key.to_string()))
}

/// Decodes `%XX` escapes and, when `plus_is_space`, `+` (form encoding).
pub fn decode_component(s: &str, plus_is_space: bool) -> String {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        match b[i] {
            b'%' if i + 2 < b.len() => {
                let hex = std::str::from_utf8(&b[i + 1..i + 3]).ok();
                match hex.and_then(|h| u8::from_str_radix(h, 16).ok()) {
                    Some(v) => {
                        out.push(v);
                        i += 3;
                    }
                    None => {
                        out.push(b'%');
                        i += 1;
                    }
                }
            }
            b'+' if plus_is_space => {
                out.push(b' ');
                i += 1;
            }
            c => {
                out.push(c);
                i += 1;
            }
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

fn percent_decode(s: &str) -> String {
    decode_component(s, false)
}

/// Percent-encodes everything but unreserved characters (for cookies and URLs).
pub fn encode_component(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for b in s.bytes() {
        if b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.' | b'~') {
            out.push(b as char);
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

/// `key=value` pairs of a query string or form body, decoded.
pub fn form_pairs(s: &str) -> Vec<(String, String)> {
    s.split('&')
        .filter(|kv| !kv.is_empty())
        .map(|kv| {
            let (k, v) = kv.split_once('=').unwrap_or((kv, ""));
            (decode_component(k, true), decode_component(v, true))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn entities_roles_and_keys() {
        assert_eq!(entity_for("alice", Role::Admin), "dashboard.admin.alice");
        assert_eq!(
            parse_entity("dashboard.read-only.bob"),
            Some((Role::ReadOnly, "bob"))
        );
        assert_eq!(parse_entity("client.admin"), None);
        assert_eq!(parse_entity("dashboard.root.x"), None);
        let mut u = Users::default();
        u.insert("alice", Role::Admin, "k+/=1".into());
        assert_eq!(u.check("alice", "k+/=1"), Some(Role::Admin));
        assert_eq!(u.check("alice", "k+/=2"), None);
        assert_eq!(u.check("bob", "k+/=1"), None);
        u.retain_entities(&["dashboard.read-only.alice".into()]);
        assert!(u.is_empty());
    }

    #[test]
    fn credentials_from_cookie_or_bearer() {
        let enc = encode_component("alice:k+/=1");
        let cookie = format!("x=1; {COOKIE}={enc}; y=2");
        assert_eq!(
            credentials(Some(&cookie), None),
            Some(("alice".into(), "k+/=1".into()))
        );
        assert_eq!(
            credentials(None, Some("Bearer bob:abc")),
            Some(("bob".into(), "abc".into()))
        );
        assert_eq!(credentials(Some("x=1"), None), None);
        assert_eq!(
            form_pairs("user=a&key=k%2B%2F%3D1&next=%2Fosds"),
            vec![
                ("user".into(), "a".into()),
                ("key".into(), "k+/=1".into()),
                ("next".into(), "/osds".into())
            ]
        );
        assert_eq!(decode_component("100%", false), "100%");
        assert_eq!(decode_component("%4", false), "%4");
    }
}
