//! MD5 of upload bodies, hashed in SIMD lanes across concurrent uploads.
//!
//! Every uploaded body is hashed with MD5 (a PUT's ETag is its MD5, a part's too). MD5 is one
//! long dependency chain per stream, so one core hashes one stream at ~0.8 GB/s, and in large
//! uploads that was 40-50 % of the gateway's CPU. Independent streams can share a core through
//! SIMD lanes: `md5-many` hashes 8 streams (AVX2) at ~4.9 GB/s and 16 (AVX-512) at ~6 GB/s on
//! the reference VM, but other lane counts fall back to slow paths (5-7 streams: ~0.2 GB/s), so
//! only full groups of 8 or 16 are hashed that way.
//!
//! Concurrent uploads are such streams. Each upload cuts its body into pieces of [`PIECE`]
//! bytes (shared `Bytes`, no copy) and sends them to one hashing thread, which keeps every
//! open stream's state and its queue of pieces (hashed in order; at most
//! `MAX_QUEUED_PIECES` per upload, 4 MiB, beyond which the upload waits). Whenever 8 or 16
//! streams have a piece waiting, their oldest pieces are hashed together in lanes; a piece
//! that waited [`MAX_WAIT`] without enough company is hashed alone, as fast as inline. While
//! its body streams in, an upload waits for the hashing only when a whole stripe of it is
//! still queued; at `finish` it waits for the rest of its own pieces (a body smaller than a
//! piece never goes to the thread at all).

use std::collections::{HashMap, VecDeque};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, mpsc};
use std::time::{Duration, Instant};

use bytes::Bytes;
use md5_many::{Md5Many, Md5State};
use tokio::sync::{OwnedSemaphorePermit, Semaphore, oneshot};

/// Bytes of a body hashed at a time (one SIMD lane's share of a group).
pub const PIECE: usize = 512 << 10;
/// Longest a piece waits for pieces of other uploads to fill a group of lanes.
pub const MAX_WAIT: Duration = Duration::from_millis(20);
/// Pieces of one upload waiting to be hashed at most (the upload waits for room beyond that):
/// one 4 MiB stripe of the gateway's.
const MAX_QUEUED_PIECES: usize = 8;

enum Msg {
    Piece {
        id: u64,
        data: Vec<Bytes>,
        /// Released once the piece is hashed.
        room: OwnedSemaphorePermit,
    },
    /// The last bytes of a body: hash everything of the stream now and answer the digest.
    Finish {
        id: u64,
        rest: Vec<Bytes>,
        reply: oneshot::Sender<[u8; 16]>,
    },
    /// The upload was abandoned.
    Forget { id: u64 },
}

/// Handle to the hashing thread; the thread ends when the last handle is dropped.
#[derive(Clone)]
pub struct Md5Batcher {
    tx: mpsc::Sender<Msg>,
    next_id: Arc<AtomicU64>,
}

impl Md5Batcher {
    /// Starts the hashing thread.
    pub fn start() -> std::io::Result<Md5Batcher> {
        let (tx, rx) = mpsc::channel::<Msg>();
        std::thread::Builder::new()
            .name("rgw-md5".into())
            .spawn(move || Hasher::default().run(rx))?;
        Ok(Md5Batcher {
            tx,
            next_id: Arc::new(AtomicU64::new(0)),
        })
    }
}

/// The MD5 of one body being received: whole pieces are hashed by the hashing thread (in
/// order, with other uploads' pieces), the rest at [`Md5Stream::finish`].
pub struct Md5Stream {
    batcher: Md5Batcher,
    id: u64,
    room: Arc<Semaphore>,
    piece: Vec<Bytes>,
    piece_len: usize,
    /// Pieces were sent and no `Finish` yet: the thread holds state for this stream.
    open: bool,
}

impl Md5Stream {
    pub fn new(batcher: &Md5Batcher) -> Md5Stream {
        Md5Stream {
            batcher: batcher.clone(),
            id: batcher.next_id.fetch_add(1, Ordering::Relaxed),
            room: Arc::new(Semaphore::new(MAX_QUEUED_PIECES)),
            piece: Vec::new(),
            piece_len: 0,
            open: false,
        }
    }

    /// Adds the next bytes of the body (no copy: `Bytes` are shared).
    pub async fn push(&mut self, mut chunk: Bytes) -> Result<(), HashFailed> {
        while !chunk.is_empty() {
            let room = PIECE - self.piece_len;
            let part = if chunk.len() > room {
                chunk.split_to(room)
            } else {
                std::mem::take(&mut chunk)
            };
            self.piece_len += part.len();
            self.piece.push(part);
            if self.piece_len == PIECE {
                let permit = self
                    .room
                    .clone()
                    .acquire_owned()
                    .await
                    .map_err(|_| HashFailed)?;
                let data = std::mem::take(&mut self.piece);
                self.piece_len = 0;
                self.open = true;
                self.batcher
                    .tx
                    .send(Msg::Piece {
                        id: self.id,
                        data,
                        room: permit,
                    })
                    .map_err(|_| HashFailed)?;
            }
        }
        Ok(())
    }

    /// The digest of everything pushed; the stream starts over empty.
    pub async fn finish(&mut self) -> Result<[u8; 16], HashFailed> {
        let rest = std::mem::take(&mut self.piece);
        self.piece_len = 0;
        if !std::mem::take(&mut self.open) {
            // Nothing went to the thread (a small body): hash it here.
            let mut state = Md5State::new();
            for d in &rest {
                state.update(d);
            }
            return Ok(state.finalize());
        }
        let (reply, rx) = oneshot::channel();
        self.batcher
            .tx
            .send(Msg::Finish {
                id: self.id,
                rest,
                reply,
            })
            .map_err(|_| HashFailed)?;
        rx.await.map_err(|_| HashFailed)
    }
}

impl Drop for Md5Stream {
    fn drop(&mut self) {
        if self.open {
            let _ = self.batcher.tx.send(Msg::Forget { id: self.id });
        }
    }
}

/// The hashing thread is gone (it panicked): the upload must fail rather than store a wrong
/// ETag.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct HashFailed;

struct Stream {
    state: Md5State,
    /// Pieces not hashed yet, oldest first, with when they arrived and the upload's permit.
    pieces: VecDeque<Queued>,
}

struct Queued {
    at: Instant,
    data: Vec<Bytes>,
    _room: OwnedSemaphorePermit,
}

#[derive(Default)]
struct Hasher {
    streams: HashMap<u64, Stream>,
    scratch: Vec<Vec<u8>>,
}

impl Hasher {
    fn run(mut self, rx: mpsc::Receiver<Msg>) {
        let engine = Md5Many::new();
        let mut open = true;
        while open || self.pending() > 0 {
            // Wait for the next message, or until the oldest piece has waited long enough.
            let msg = match self.oldest() {
                None => rx.recv().map_err(|_| mpsc::RecvTimeoutError::Disconnected),
                Some(t) => {
                    let deadline = t + MAX_WAIT;
                    let now = Instant::now();
                    if now >= deadline || !open {
                        Err(mpsc::RecvTimeoutError::Timeout)
                    } else {
                        rx.recv_timeout(deadline - now)
                    }
                }
            };
            match msg {
                Ok(m) => {
                    self.take(m);
                    // Take everything already queued before deciding.
                    while let Ok(m) = rx.try_recv() {
                        self.take(m);
                    }
                }
                Err(mpsc::RecvTimeoutError::Disconnected) => open = false,
                Err(mpsc::RecvTimeoutError::Timeout) => {}
            }
            // Full groups of lanes while there are enough streams with pieces.
            loop {
                let ready = self.pending();
                let lanes = if ready >= 16 {
                    16
                } else if ready >= 8 {
                    8
                } else {
                    break;
                };
                self.hash_group(&engine, lanes);
            }
            // Pieces that waited long enough (or all, once the gateway is closing): alone.
            let now = Instant::now();
            for s in self.streams.values_mut() {
                while let Some(q) = s.pieces.front() {
                    if open && now < q.at + MAX_WAIT {
                        break;
                    }
                    let q = s.pieces.pop_front().expect("front exists");
                    for d in &q.data {
                        s.state.update(d);
                    }
                }
            }
        }
    }

    fn take(&mut self, m: Msg) {
        match m {
            Msg::Piece { id, data, room } => {
                let s = self.streams.entry(id).or_insert_with(|| Stream {
                    state: Md5State::new(),
                    pieces: VecDeque::new(),
                });
                s.pieces.push_back(Queued {
                    at: Instant::now(),
                    data,
                    _room: room,
                });
            }
            Msg::Finish { id, rest, reply } => {
                let mut state = Md5State::new();
                if let Some(s) = self.streams.remove(&id) {
                    state = s.state;
                    for q in s.pieces {
                        for d in &q.data {
                            state.update(d);
                        }
                    }
                }
                for d in &rest {
                    state.update(d);
                }
                let _ = reply.send(state.finalize());
            }
            Msg::Forget { id } => {
                self.streams.remove(&id);
            }
        }
    }

    /// Streams with at least one piece waiting.
    fn pending(&self) -> usize {
        self.streams
            .values()
            .filter(|s| !s.pieces.is_empty())
            .count()
    }

    fn oldest(&self) -> Option<Instant> {
        self.streams
            .values()
            .filter_map(|s| s.pieces.front().map(|q| q.at))
            .min()
    }

    /// Hashes the oldest piece of each of the `lanes` streams whose pieces waited longest.
    fn hash_group(&mut self, engine: &Md5Many, lanes: usize) {
        let mut ids: Vec<(Instant, u64)> = self
            .streams
            .iter()
            .filter_map(|(id, s)| s.pieces.front().map(|q| (q.at, *id)))
            .collect();
        ids.sort_unstable();
        ids.truncate(lanes);
        let mut pieces: Vec<Vec<Bytes>> = Vec::with_capacity(lanes);
        let mut states: Vec<Md5State> = Vec::with_capacity(lanes);
        for (_, id) in &ids {
            let s = self.streams.get_mut(id).expect("listed above");
            pieces.push(s.pieces.pop_front().expect("has a piece").data);
            states.push(s.state);
        }
        hash_lanes(engine, &mut states, &pieces, &mut self.scratch);
        for ((_, id), st) in ids.iter().zip(states) {
            self.streams.get_mut(id).expect("listed above").state = st;
        }
    }
}

/// Appends `pieces[i]` to `states[i]` for 8 or 16 streams at once.
fn hash_lanes(
    engine: &Md5Many,
    states: &mut [Md5State],
    pieces: &[Vec<Bytes>],
    scratch: &mut Vec<Vec<u8>>,
) {
    scratch.resize_with(pieces.len(), Vec::new);
    for (p, buf) in pieces.iter().zip(scratch.iter_mut()) {
        buf.clear();
        if p.len() > 1 {
            for d in p {
                buf.extend_from_slice(d);
            }
        }
    }
    let inputs: Vec<&[u8]> = pieces
        .iter()
        .zip(scratch.iter())
        .map(|(p, buf)| match p.as_slice() {
            [one] => &one[..],
            [] => &[][..],
            _ => &buf[..],
        })
        .collect();
    engine.update_many(states, &inputs);
}

#[cfg(test)]
mod tests {
    use super::*;

    fn body(seed: u32, len: usize) -> Vec<u8> {
        (0..len as u32)
            .map(|i| (i.wrapping_mul(2_654_435_761).wrapping_add(seed) >> 11) as u8)
            .collect()
    }

    fn reference(data: &[u8]) -> [u8; 16] {
        let mut s = Md5State::new();
        s.update(data);
        s.finalize()
    }

    /// Streams of different lengths, fed concurrently in uneven chunks (so pieces are cut
    /// across chunks and groups of 8 and 16 form as well as single hashing), give the digests
    /// of hashing each alone.
    async fn streams(n: u32, base_len: usize) {
        let b = Md5Batcher::start().unwrap();
        let mut tasks = Vec::new();
        for k in 0..n {
            let b = b.clone();
            tasks.push(tokio::spawn(async move {
                let data = body(k, base_len + k as usize * 7919);
                let mut h = Md5Stream::new(&b);
                let mut at = 0;
                let mut piece = 1 + k as usize * 13;
                while at < data.len() {
                    let end = (at + piece).min(data.len());
                    h.push(Bytes::copy_from_slice(&data[at..end]))
                        .await
                        .unwrap();
                    at = end;
                    piece = piece * 3 % 200_003 + 64;
                    tokio::task::yield_now().await;
                }
                (h.finish().await.unwrap(), reference(&data))
            }));
        }
        for t in tasks {
            let (got, want) = t.await.unwrap();
            assert_eq!(got, want);
        }
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn many_concurrent_streams_hash_as_if_alone() {
        streams(24, 3 * PIECE + 12_345).await;
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn one_stream_and_small_bodies() {
        streams(1, 5 * PIECE).await;
        streams(3, 1000).await;
        streams(1, 0).await;
    }

    /// The lane path itself: groups of 8 and 16, pieces in one or several chunks, streams
    /// already started, give what hashing each alone gives.
    #[test]
    fn groups_of_lanes_match_single_hashing() {
        let engine = Md5Many::new();
        let mut scratch = Vec::new();
        for lanes in [8usize, 16] {
            let mut want = Vec::new();
            let mut states = Vec::new();
            let mut pieces = Vec::new();
            for k in 0..lanes {
                let prefix = body(k as u32 + 100, 1000 + k * 77);
                let data = body(k as u32, PIECE);
                let mut state = Md5State::new();
                state.update(&prefix);
                states.push(state);
                let mut whole = prefix.clone();
                whole.extend_from_slice(&data);
                want.push(reference(&whole));
                let b = Bytes::from(data);
                pieces.push(if k % 2 == 0 {
                    vec![b]
                } else {
                    vec![b.slice(..4097), b.slice(4097..300_000), b.slice(300_000..)]
                });
            }
            hash_lanes(&engine, &mut states, &pieces, &mut scratch);
            for (s, w) in states.into_iter().zip(want) {
                assert_eq!(s.finalize(), w, "{lanes} lanes");
            }
        }
    }

    #[test]
    fn known_digests() {
        let hex = |d: [u8; 16]| d.iter().map(|b| format!("{b:02x}")).collect::<String>();
        assert_eq!(hex(reference(b"")), "d41d8cd98f00b204e9800998ecf8427e");
        assert_eq!(
            hex(reference(b"The quick brown fox jumps over the lazy dog")),
            "9e107d9d372bb6826bd81d3542a419d6"
        );
    }
}
