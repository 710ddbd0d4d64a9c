//! The connection handshake: protocol version check and mutual shared-secret authentication.
//!
//! Sequence (client = the side that dialled):
//!
//! ```text
//! client                                              server
//!   Hello{client_entity, client_nonce}        ──▶
//!                                             ◀──  Challenge{server_entity, server_nonce,
//!                                                            server_proof}   (or Reject)
//!   verify server_proof
//!   Proof{client_proof}                       ──▶
//!                                                  verify client_proof
//!                                             ◀──  Accept                      (or Reject)
//! ```
//!
//! `server_proof = HMAC-SHA256(key, "kelp-msgr/v1/server" ‖ transcript)` and
//! `client_proof = HMAC-SHA256(key, "kelp-msgr/v1/client" ‖ transcript)`, where `key` is the
//! client entity's secret and `transcript = version ‖ client_entity ‖ server_entity ‖
//! client_nonce ‖ server_nonce` (entities length-prefixed). Invariants:
//!
//! - the key never crosses the wire; only HMACs over fresh 32-byte random nonces do;
//! - each side's proof covers the *other* side's fresh nonce, so a recorded proof is useless on
//!   any later connection (replay fails), and the distinct labels stop one side's proof from
//!   being reflected as the other's;
//! - proofs are compared in constant time (`Mac::verify_slice`);
//! - every read is bounded (message size ≤ [`MAX_BODY`], whole handshake ≤ the configured
//!   timeout), so a silent or garbage-spewing peer costs one task for a bounded time.
//!
//! Handshake messages: `magic "KLHS" (4) ‖ version u16 LE ‖ kind u8 ‖ body_len u16 LE ‖ body`.
//! The magic and version fields sit at these offsets in every version, forever; that is what
//! lets a future version be told apart (see `docs/MESSENGER.md`, "Versioning").
//!
//! This module is public for tools and tests that need to speak the handshake by hand; daemons
//! use [`crate::Messenger`].

use std::time::Duration;

use hmac::{Hmac, Mac};
use sha2::Sha256;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};

use crate::auth::{KeyLookup, MAX_ENTITY_LEN, Secret, random_bytes, validate_entity};
use crate::error::{AuthFailure, MsgrError, Result};

/// Magic of every handshake message.
pub const HS_MAGIC: [u8; 4] = *b"KLHS";
/// The handshake protocol version this build speaks.
pub const PROTOCOL_VERSION: u16 = 1;
/// Largest handshake message body.
pub const MAX_BODY: usize = 512;
/// Size of nonces and proofs.
pub const NONCE_LEN: usize = 32;

const KIND_HELLO: u8 = 1;
const KIND_CHALLENGE: u8 = 2;
const KIND_PROOF: u8 = 3;
const KIND_ACCEPT: u8 = 4;
const KIND_REJECT: u8 = 5;

/// Why a peer refused the handshake (first byte of a `Reject` body).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RejectCode {
    AuthFailed = 1,
    VersionMismatch = 2,
    Protocol = 3,
}

impl RejectCode {
    fn from_u8(b: u8) -> RejectCode {
        match b {
            1 => RejectCode::AuthFailed,
            2 => RejectCode::VersionMismatch,
            _ => RejectCode::Protocol,
        }
    }
}

/// One handshake message.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum HsMessage {
    Hello {
        entity: String,
        nonce: [u8; NONCE_LEN],
    },
    Challenge {
        entity: String,
        nonce: [u8; NONCE_LEN],
        proof: [u8; NONCE_LEN],
    },
    Proof {
        proof: [u8; NONCE_LEN],
    },
    Accept,
    Reject {
        code: RejectCode,
        reason: String,
    },
}

impl HsMessage {
    /// Wire form with the given header version.
    pub fn encode(&self, version: u16) -> Vec<u8> {
        let mut body = Vec::new();
        let kind = match self {
            HsMessage::Hello { entity, nonce } => {
                put_str(&mut body, entity);
                body.extend_from_slice(nonce);
                KIND_HELLO
            }
            HsMessage::Challenge {
                entity,
                nonce,
                proof,
            } => {
                put_str(&mut body, entity);
                body.extend_from_slice(nonce);
                body.extend_from_slice(proof);
                KIND_CHALLENGE
            }
            HsMessage::Proof { proof } => {
                body.extend_from_slice(proof);
                KIND_PROOF
            }
            HsMessage::Accept => KIND_ACCEPT,
            HsMessage::Reject { code, reason } => {
                body.push(*code as u8);
                let r: String = reason.chars().take(200).collect();
                put_str(&mut body, &r);
                KIND_REJECT
            }
        };
        let mut out = Vec::with_capacity(9 + body.len());
        out.extend_from_slice(&HS_MAGIC);
        out.extend_from_slice(&version.to_le_bytes());
        out.push(kind);
        out.extend_from_slice(&(body.len() as u16).to_le_bytes());
        out.extend_from_slice(&body);
        out
    }
}

fn put_str(out: &mut Vec<u8>, s: &str) {
    let b = &s.as_bytes()[..s.len().min(255)];
    out.push(b.len() as u8);
    out.extend_from_slice(b);
}

/// A handshake message as read: its header version and, if that version is ours, the message.
#[derive(Debug)]
pub enum HsRead {
    Message(HsMessage),
    /// A well-framed message of another protocol version; its body was not interpreted.
    OtherVersion(u16),
}

/// Reads one handshake message; `peer` names the other side in errors.
pub async fn read_message<R: AsyncRead + Unpin>(r: &mut R, peer: &str) -> Result<HsRead> {
    let proto = |reason: String| MsgrError::Handshake {
        peer: peer.to_string(),
        reason,
    };
    let mut h = [0u8; 9];
    r.read_exact(&mut h)
        .await
        .map_err(|e| proto(format!("reading handshake header: {e}")))?;
    if h[0..4] != HS_MAGIC {
        return Err(proto(format!(
            "not a kelp handshake (magic {:02x?})",
            &h[0..4]
        )));
    }
    let version = u16::from_le_bytes([h[4], h[5]]);
    let kind = h[6];
    let len = u16::from_le_bytes([h[7], h[8]]) as usize;
    if len > MAX_BODY {
        return Err(proto(format!(
            "handshake message of {len} bytes is too large"
        )));
    }
    let mut body = vec![0u8; len];
    r.read_exact(&mut body)
        .await
        .map_err(|e| proto(format!("reading handshake body: {e}")))?;
    if version != PROTOCOL_VERSION {
        return Ok(HsRead::OtherVersion(version));
    }
    let mut cur = Cursor { buf: &body, pos: 0 };
    let bad = || proto(format!("malformed handshake message (kind {kind})"));
    let msg = match kind {
        KIND_HELLO => HsMessage::Hello {
            entity: cur.string().ok_or_else(bad)?,
            nonce: cur.array().ok_or_else(bad)?,
        },
        KIND_CHALLENGE => HsMessage::Challenge {
            entity: cur.string().ok_or_else(bad)?,
            nonce: cur.array().ok_or_else(bad)?,
            proof: cur.array().ok_or_else(bad)?,
        },
        KIND_PROOF => HsMessage::Proof {
            proof: cur.array().ok_or_else(bad)?,
        },
        KIND_ACCEPT => HsMessage::Accept,
        KIND_REJECT => HsMessage::Reject {
            code: RejectCode::from_u8(cur.byte().ok_or_else(bad)?),
            reason: cur.string().ok_or_else(bad)?,
        },
        other => return Err(proto(format!("unknown handshake message kind {other}"))),
    };
    if cur.pos != body.len() {
        return Err(bad());
    }
    Ok(HsRead::Message(msg))
}

struct Cursor<'a> {
    buf: &'a [u8],
    pos: usize,
}

impl Cursor<'_> {
    fn take(&mut self, n: usize) -> Option<&[u8]> {
        let s = self.buf.get(self.pos..self.pos.checked_add(n)?)?;
        self.pos += n;
        Some(s)
    }
    fn byte(&mut self) -> Option<u8> {
        self.take(1).map(|b| b[0])
    }
    fn string(&mut self) -> Option<String> {
        let n = self.byte()? as usize;
        let s = self.take(n)?;
        if n > MAX_ENTITY_LEN + 127 {
            return None;
        }
        String::from_utf8(s.to_vec()).ok()
    }
    fn array<const N: usize>(&mut self) -> Option<[u8; N]> {
        self.take(N)?.try_into().ok()
    }
}

/// What both proofs are computed over.
#[derive(Clone, Debug)]
pub struct Transcript<'a> {
    pub version: u16,
    pub client_entity: &'a str,
    pub server_entity: &'a str,
    pub client_nonce: &'a [u8; NONCE_LEN],
    pub server_nonce: &'a [u8; NONCE_LEN],
}

const SERVER_LABEL: &[u8] = b"kelp-msgr/v1/server";
const CLIENT_LABEL: &[u8] = b"kelp-msgr/v1/client";

fn mac(secret: &Secret, label: &[u8], t: &Transcript<'_>) -> Hmac<Sha256> {
    // HMAC accepts keys of any length; `new_from_slice` cannot fail for HMAC.
    let mut m = match Hmac::<Sha256>::new_from_slice(secret.as_bytes()) {
        Ok(m) => m,
        Err(_) => unreachable!("HMAC takes keys of any length"),
    };
    m.update(label);
    m.update(&t.version.to_le_bytes());
    for e in [t.client_entity, t.server_entity] {
        m.update(&[e.len().min(255) as u8]);
        m.update(e.as_bytes());
    }
    m.update(t.client_nonce);
    m.update(t.server_nonce);
    m
}

/// The server's proof that it holds the client's key.
pub fn server_proof(secret: &Secret, t: &Transcript<'_>) -> [u8; NONCE_LEN] {
    mac(secret, SERVER_LABEL, t).finalize().into_bytes().into()
}

/// The client's proof that it holds its own key.
pub fn client_proof(secret: &Secret, t: &Transcript<'_>) -> [u8; NONCE_LEN] {
    mac(secret, CLIENT_LABEL, t).finalize().into_bytes().into()
}

fn verify(secret: &Secret, label: &[u8], t: &Transcript<'_>, proof: &[u8]) -> bool {
    mac(secret, label, t).verify_slice(proof).is_ok()
}

async fn send<W: AsyncWrite + Unpin>(w: &mut W, msg: &HsMessage, peer: &str) -> Result<()> {
    w.write_all(&msg.encode(PROTOCOL_VERSION))
        .await
        .map_err(|e| MsgrError::Handshake {
            peer: peer.to_string(),
            reason: format!("writing handshake: {e}"),
        })
}

/// Best effort: tell the peer why before closing. Errors are ignored because the connection is
/// being abandoned anyway.
async fn reject<W: AsyncWrite + Unpin>(w: &mut W, code: RejectCode, reason: &str) {
    let msg = HsMessage::Reject {
        code,
        reason: reason.to_string(),
    };
    let _ = w.write_all(&msg.encode(PROTOCOL_VERSION)).await;
    let _ = w.flush().await;
}

fn rejected(peer: &str, code: RejectCode, reason: String) -> MsgrError {
    match code {
        RejectCode::AuthFailed => MsgrError::AuthFailed {
            peer: peer.to_string(),
            failure: AuthFailure::Rejected { reason },
        },
        RejectCode::VersionMismatch => MsgrError::Handshake {
            peer: peer.to_string(),
            reason: format!("peer reports a version mismatch: {reason}"),
        },
        RejectCode::Protocol => MsgrError::Handshake {
            peer: peer.to_string(),
            reason: format!("peer rejected the handshake: {reason}"),
        },
    }
}

fn unexpected(peer: &str, what: &str, got: &HsMessage) -> MsgrError {
    MsgrError::Handshake {
        peer: peer.to_string(),
        reason: format!("expected {what}, got {got:?}"),
    }
}

fn timed_out(peer: &str, after: Duration) -> MsgrError {
    MsgrError::Handshake {
        peer: peer.to_string(),
        reason: format!("not completed within {after:?}"),
    }
}

/// Runs the client side. Returns the server's entity name.
pub async fn client<S: AsyncRead + AsyncWrite + Unpin>(
    stream: &mut S,
    local_entity: &str,
    secret: &Secret,
    timeout: Duration,
    peer: &str,
) -> Result<String> {
    tokio::time::timeout(timeout, client_inner(stream, local_entity, secret, peer))
        .await
        .map_err(|_| timed_out(peer, timeout))?
}

async fn client_inner<S: AsyncRead + AsyncWrite + Unpin>(
    s: &mut S,
    local_entity: &str,
    secret: &Secret,
    peer: &str,
) -> Result<String> {
    let client_nonce = random_bytes::<NONCE_LEN>();
    send(
        s,
        &HsMessage::Hello {
            entity: local_entity.to_string(),
            nonce: client_nonce,
        },
        peer,
    )
    .await?;
    let (server_entity, server_nonce, proof) = match read_message(s, peer).await? {
        HsRead::OtherVersion(theirs) => {
            return Err(MsgrError::VersionMismatch {
                peer: peer.to_string(),
                ours: PROTOCOL_VERSION,
                theirs,
            });
        }
        HsRead::Message(HsMessage::Challenge {
            entity,
            nonce,
            proof,
        }) => (entity, nonce, proof),
        HsRead::Message(HsMessage::Reject { code, reason }) => {
            return Err(rejected(peer, code, reason));
        }
        HsRead::Message(other) => return Err(unexpected(peer, "Challenge", &other)),
    };
    validate_entity(&server_entity).map_err(|e| MsgrError::Handshake {
        peer: peer.to_string(),
        reason: e.to_string(),
    })?;
    let t = Transcript {
        version: PROTOCOL_VERSION,
        client_entity: local_entity,
        server_entity: &server_entity,
        client_nonce: &client_nonce,
        server_nonce: &server_nonce,
    };
    if !verify(secret, SERVER_LABEL, &t, &proof) {
        reject(s, RejectCode::AuthFailed, "server proof did not verify").await;
        return Err(MsgrError::AuthFailed {
            peer: format!("{server_entity}@{peer}"),
            failure: AuthFailure::BadServerProof,
        });
    }
    send(
        s,
        &HsMessage::Proof {
            proof: client_proof(secret, &t),
        },
        peer,
    )
    .await?;
    match read_message(s, peer).await? {
        HsRead::Message(HsMessage::Accept) => Ok(server_entity),
        HsRead::Message(HsMessage::Reject { code, reason }) => Err(rejected(peer, code, reason)),
        HsRead::Message(other) => Err(unexpected(peer, "Accept", &other)),
        HsRead::OtherVersion(theirs) => Err(MsgrError::VersionMismatch {
            peer: peer.to_string(),
            ours: PROTOCOL_VERSION,
            theirs,
        }),
    }
}

/// Runs the server side. Returns the authenticated client's entity name.
pub async fn server<S: AsyncRead + AsyncWrite + Unpin>(
    stream: &mut S,
    local_entity: &str,
    keys: &dyn KeyLookup,
    timeout: Duration,
    peer: &str,
) -> Result<String> {
    tokio::time::timeout(timeout, server_inner(stream, local_entity, keys, peer))
        .await
        .map_err(|_| timed_out(peer, timeout))?
}

async fn server_inner<S: AsyncRead + AsyncWrite + Unpin>(
    s: &mut S,
    local_entity: &str,
    keys: &dyn KeyLookup,
    peer: &str,
) -> Result<String> {
    let (client_entity, client_nonce) = match read_message(s, peer).await? {
        HsRead::OtherVersion(theirs) => {
            reject(
                s,
                RejectCode::VersionMismatch,
                &format!("server speaks handshake version {PROTOCOL_VERSION}, client {theirs}"),
            )
            .await;
            return Err(MsgrError::VersionMismatch {
                peer: peer.to_string(),
                ours: PROTOCOL_VERSION,
                theirs,
            });
        }
        HsRead::Message(HsMessage::Hello { entity, nonce }) => (entity, nonce),
        HsRead::Message(other) => {
            reject(s, RejectCode::Protocol, "expected Hello").await;
            return Err(unexpected(peer, "Hello", &other));
        }
    };
    if let Err(e) = validate_entity(&client_entity) {
        reject(s, RejectCode::Protocol, "invalid entity name").await;
        return Err(MsgrError::Handshake {
            peer: peer.to_string(),
            reason: e.to_string(),
        });
    }
    let who = format!("{client_entity}@{peer}");
    let Some(secret) = keys.secret_for(&client_entity) else {
        reject(s, RejectCode::AuthFailed, "unknown entity").await;
        return Err(MsgrError::AuthFailed {
            peer: who,
            failure: AuthFailure::UnknownEntity,
        });
    };
    let server_nonce = random_bytes::<NONCE_LEN>();
    let t = Transcript {
        version: PROTOCOL_VERSION,
        client_entity: &client_entity,
        server_entity: local_entity,
        client_nonce: &client_nonce,
        server_nonce: &server_nonce,
    };
    send(
        s,
        &HsMessage::Challenge {
            entity: local_entity.to_string(),
            nonce: server_nonce,
            proof: server_proof(&secret, &t),
        },
        peer,
    )
    .await?;
    let proof = match read_message(s, peer).await? {
        HsRead::Message(HsMessage::Proof { proof }) => proof,
        HsRead::Message(HsMessage::Reject {
            code: RejectCode::AuthFailed,
            reason,
        }) => {
            return Err(MsgrError::AuthFailed {
                peer: who,
                failure: AuthFailure::Rejected { reason },
            });
        }
        HsRead::Message(other) => {
            reject(s, RejectCode::Protocol, "expected Proof").await;
            return Err(unexpected(&who, "Proof", &other));
        }
        HsRead::OtherVersion(theirs) => {
            return Err(MsgrError::VersionMismatch {
                peer: who,
                ours: PROTOCOL_VERSION,
                theirs,
            });
        }
    };
    if !verify(&secret, CLIENT_LABEL, &t, &proof) {
        reject(s, RejectCode::AuthFailed, "client proof did not verify").await;
        return Err(MsgrError::AuthFailed {
            peer: who,
            failure: AuthFailure::BadClientProof,
        });
    }
    send(s, &HsMessage::Accept, peer).await?;
    Ok(client_entity)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::auth::{Keyring, generate_secret};

    #[test]
    fn messages_round_trip() {
        let msgs = [
            HsMessage::Hello {
                entity: "osd.1".into(),
                nonce: [1; 32],
            },
            HsMessage::Challenge {
                entity: "mon.a".into(),
                nonce: [2; 32],
                proof: [3; 32],
            },
            HsMessage::Proof { proof: [4; 32] },
            HsMessage::Accept,
            HsMessage::Reject {
                code: RejectCode::AuthFailed,
                reason: "no".into(),
            },
        ];
        let rt = tokio::runtime::Builder::new_current_thread()
            .build()
            .unwrap();
        for m in msgs {
            let wire = m.encode(PROTOCOL_VERSION);
            let got = rt.block_on(read_message(&mut &wire[..], "t")).unwrap();
            match got {
                HsRead::Message(g) => assert_eq!(g, m),
                other => panic!("{other:?}"),
            }
            let v2 = m.encode(2);
            assert!(matches!(
                rt.block_on(read_message(&mut &v2[..], "t")).unwrap(),
                HsRead::OtherVersion(2)
            ));
        }
    }

    #[test]
    fn proofs_differ_by_label_and_nonce() {
        let k = generate_secret();
        let t = Transcript {
            version: 1,
            client_entity: "client.a",
            server_entity: "mon.a",
            client_nonce: &[1; 32],
            server_nonce: &[2; 32],
        };
        assert_ne!(server_proof(&k, &t), client_proof(&k, &t));
        let t2 = Transcript {
            server_nonce: &[3; 32],
            ..t.clone()
        };
        assert_ne!(client_proof(&k, &t), client_proof(&k, &t2));
        assert!(verify(&k, CLIENT_LABEL, &t, &client_proof(&k, &t)));
        assert!(!verify(
            &generate_secret(),
            CLIENT_LABEL,
            &t,
            &client_proof(&k, &t)
        ));
    }

    #[tokio::test]
    async fn in_memory_handshake_outcomes() {
        let key = generate_secret();
        let mut kr = Keyring::new();
        kr.insert("client.a", key.clone()).unwrap();
        let t = Duration::from_secs(5);

        // success
        let (mut a, mut b) = tokio::io::duplex(4096);
        let kr2 = kr.clone();
        let srv = tokio::spawn(async move { server(&mut b, "mon.a", &kr2, t, "c").await });
        assert_eq!(
            client(&mut a, "client.a", &key, t, "s").await.unwrap(),
            "mon.a"
        );
        assert_eq!(srv.await.unwrap().unwrap(), "client.a");

        // wrong key: both sides AuthFailed
        let (mut a, mut b) = tokio::io::duplex(4096);
        let kr2 = kr.clone();
        let srv = tokio::spawn(async move { server(&mut b, "mon.a", &kr2, t, "c").await });
        let c = client(&mut a, "client.a", &generate_secret(), t, "s").await;
        assert!(
            matches!(
                c,
                Err(MsgrError::AuthFailed {
                    failure: AuthFailure::BadServerProof,
                    ..
                })
            ),
            "{c:?}"
        );
        let s = srv.await.unwrap();
        assert!(matches!(s, Err(MsgrError::AuthFailed { .. })), "{s:?}");

        // silent peer: bounded by the timeout
        let (_a, mut b) = tokio::io::duplex(4096);
        let r = server(&mut b, "mon.a", &kr, Duration::from_millis(50), "c").await;
        assert!(matches!(r, Err(MsgrError::Handshake { .. })), "{r:?}");
    }
}
