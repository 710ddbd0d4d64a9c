//! The completed-request table: what makes a client's retry of a mutation idempotent across
//! a lost reply, a reconnect and an MDS failover (CephFS's "completed requests").
//!
//! Every client request carries the client's id and a transaction id (`tid`) that the client
//! keeps when it retries. When a mutation completes, the namespace records, per client, the
//! tid and what it answered ([`Done`]); the record is journaled in the same entry as the
//! mutation's updates ([`Update::Request`]), so a standby that replays the journal knows it,
//! and the checkpoint writes the whole table (`mds.requests`), so trimming the journal does not
//! lose it. A retried request whose tid is in the table gets the recorded answer and is not
//! applied again: a create whose reply was lost is not answered EEXIST, an unlink not ENOENT,
//! a rename not ENOENT.
//!
//! Only mutations that changed something are recorded: one that failed changed nothing, so
//! applying it again is harmless and gives the current answer.
//!
//! Bounded: each request names the client's oldest unanswered tid, below which the client
//! never retries, and the table forgets that client's tids below it; records older than
//! [`MAX_AGE_SECS`] (a client retries for two minutes at most) and beyond [`MAX_PER_CLIENT`]
//! per client are dropped too.

use super::*;
use serde::{Deserialize, Serialize};

/// Records older than this are forgotten (a client stops retrying long before).
pub const MAX_AGE_SECS: i64 = 600;
/// Most records kept per client (its oldest go first).
pub const MAX_PER_CLIENT: usize = 4096;

/// Per client, tid -> (the answer, when it completed).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct RequestTable {
    clients: BTreeMap<u64, BTreeMap<u64, (Done, Time)>>,
}

impl RequestTable {
    /// The recorded answer of `client`'s request `tid`, if it completed.
    pub fn get(&self, client: u64, tid: u64) -> Option<Done> {
        self.clients.get(&client)?.get(&tid).map(|(d, _)| *d)
    }

    /// Forgets `client`'s tids below `oldest` (it will never retry them).
    pub fn forget_below(&mut self, client: u64, oldest: u64) {
        if let Some(m) = self.clients.get_mut(&client) {
            *m = m.split_off(&oldest);
            if m.is_empty() {
                self.clients.remove(&client);
            }
        }
    }

    /// Records that `client`'s request `tid` completed with `done` at `at` (and forgets its
    /// tids below `oldest`).
    pub fn record(&mut self, client: u64, tid: u64, oldest: u64, done: Done, at: Time) {
        self.forget_below(client, oldest);
        if tid < oldest {
            return;
        }
        let m = self.clients.entry(client).or_default();
        m.insert(tid, (done, at));
        while m.len() > MAX_PER_CLIENT {
            m.pop_first();
        }
    }

    /// Replays one journaled update (others are ignored).
    pub fn apply(&mut self, u: &Update) {
        if let Update::Request {
            client,
            tid,
            oldest,
            done,
            at,
        } = u
        {
            self.record(*client, *tid, *oldest, *done, *at);
        }
    }

    /// Forgets records older than [`MAX_AGE_SECS`] before `now`.
    pub fn expire(&mut self, now: Time) {
        let limit = now.secs.saturating_sub(MAX_AGE_SECS);
        self.clients.retain(|_, m| {
            m.retain(|_, (_, at)| at.secs >= limit);
            !m.is_empty()
        });
    }

    /// Records kept, over all clients.
    pub fn len(&self) -> usize {
        self.clients.values().map(BTreeMap::len).sum()
    }

    pub fn is_empty(&self) -> bool {
        self.clients.is_empty()
    }
}

/// The stored table (the object [`crate::journal::REQUESTS_OBJECT`]).
#[derive(Debug, Serialize, Deserialize)]
pub struct StoredRequests {
    pub v: u8,
    pub table: RequestTable,
}

impl Namespace {
    /// [`Namespace::apply`] for a client request identified by `req`: a mutation already
    /// completed under `req.tid` is answered as it was then (with the inode's current
    /// attributes) and not applied again; one that completes now is recorded, in the table
    /// and in its updates.
    pub fn apply_request(&mut self, req: RequestId, caller: Caller, op: &Op, now: Time) -> Step {
        if req.tid == 0 || !op.is_mutation() {
            return self.apply(req.client, caller, op, now);
        }
        self.requests.forget_below(req.client, req.oldest);
        if let Some(done) = self.requests.get(req.client, req.tid) {
            tracing::debug!(
                client = req.client,
                tid = req.tid,
                "a retried request answered from the completed-request table"
            );
            let reply = match done {
                Done::Ok => Reply::Ok,
                Done::Attr(ino) => match self.inodes.get(&ino) {
                    Some(i) => Reply::Attr(i.clone()),
                    None => return Step::Need(Need::Inode(ino)),
                },
            };
            if let (Op::Mknod { open: true, .. }, Reply::Attr(i)) = (op, &reply) {
                // a create that also opened: the client holds it open (once, however often
                // the request is retried; registered again if this MDS took over since)
                self.opens
                    .entry(i.ino)
                    .or_default()
                    .entry(req.client)
                    .or_insert(1);
            }
            return Step::Done {
                reply,
                updates: Vec::new(),
                invalidate: Invalidate {
                    v: PROTOCOL_VERSION,
                    inodes: Vec::new(),
                    entries: Vec::new(),
                },
            };
        }
        if let Some(h) = req.ino_hint
            && self.hint_needs_probe(h)
        {
            return Step::Need(Need::Probe(h));
        }
        if req.delegated {
            // a create the client answered itself: the number it gave, or nothing
            let given = matches!(
                op,
                Op::Mknod {
                    exclusive: true,
                    ..
                }
            ) && req.ino_hint.is_some_and(|h| self.hint_allowed(h));
            if !given {
                tracing::warn!(
                    client = req.client,
                    ino = ?req.ino_hint,
                    "a create sent behind names an inode number that is not the client's to give"
                );
                return Step::Done {
                    reply: Reply::Err(errno::ESTALE),
                    updates: Vec::new(),
                    invalidate: Invalidate {
                        v: PROTOCOL_VERSION,
                        inodes: Vec::new(),
                        entries: Vec::new(),
                    },
                };
            }
        }
        self.ino_hint = req.ino_hint;
        let mut step = self.apply(req.client, caller, op, now);
        self.ino_hint = None;
        if let Step::Done { reply, updates, .. } = &mut step
            && !updates.is_empty()
            && let Some(done) = Done::of(reply)
        {
            self.requests
                .record(req.client, req.tid, req.oldest, done, now);
            updates.push(Update::Request {
                client: req.client,
                tid: req.tid,
                oldest: req.oldest,
                done,
                at: now,
            });
        }
        step
    }

    /// The completed-request table as the checkpoint stores it (expired records dropped).
    pub fn requests_snapshot(&mut self, now: Time) -> RequestTable {
        self.requests.expire(now);
        self.requests.clone()
    }

    /// Whether `client`'s request `tid` is in the completed-request table.
    pub fn completed(&self, client: u64, tid: u64) -> bool {
        self.requests.get(client, tid).is_some()
    }

    /// The table a replay rebuilt (at activation).
    pub fn set_requests(&mut self, table: RequestTable) {
        self.requests = table;
    }
}
