//! The transmission phase of one connection: a reader that decodes and checks requests, one
//! task per accepted request that calls the device, and one writer that sends every reply.
//!
//! Bounds (so that a client can make the server hold only so much for it):
//! - at most `max_in_flight` requests of a connection are between "header read" and "reply
//!   written"; the reader waits for a slot before it reads the next request's payload;
//! - at most `max_in_flight_bytes` of read and write payload are held at once;
//! - a write's payload is at most the payload limit (checked before it is read); a rejected
//!   write's payload is read and dropped in constant memory, or the connection is closed.
//!
//! Replies may go out in any order (the protocol allows it); each is written whole by the one
//! writer, so chunks of different replies never interleave mid-message.
//!
//! Hot path: every request's reply passes through the writer. It sends whatever replies are
//! ready in one system call, and while other requests of the connection are still being
//! worked on it first lets them run (one scheduler pass), so that replies finishing together
//! share a send (on loopback a send also runs the receiver's TCP processing, so each one saved
//! is worth several microseconds).

use std::sync::Arc;

use bytes::{Bytes, BytesMut};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt, BufWriter};
use tokio::sync::{OwnedSemaphorePermit, Semaphore, mpsc, watch};
use tracing::{debug, trace};

use crate::ConnError;
use crate::device::{BlockDevice, DeviceError, Extent};
use crate::handshake::{BASE_ALLOCATION_ID, Session};
use crate::validate::{Command, Payload, check_request};
use crate::wire::{self, errno, reply};

/// Most descriptors sent in one block-status reply (the protocol lets a server describe a
/// prefix of the range; the client asks again for the rest).
pub const MAX_EXTENTS_PER_REPLY: usize = 1 << 16;

/// Per-connection bounds, from [`crate::ServerConfig`].
#[derive(Clone, Copy, Debug)]
pub(crate) struct Limits {
    pub max_in_flight: usize,
    pub max_in_flight_bytes: u32,
}

/// One reply ready to be written, holding the request's slots until it is on the wire.
struct Outgoing {
    head: Vec<u8>,
    data: Bytes,
    _slot: OwnedSemaphorePermit,
    _bytes: Option<OwnedSemaphorePermit>,
}

/// Runs transmission until the client disconnects, the connection breaks, or the server stops
/// (then in-flight requests are answered and the connection closed).
pub(crate) async fn transmit<R, W>(
    r: &mut R,
    w: W,
    session: Session,
    limits: Limits,
    stopping: watch::Receiver<bool>,
    metrics: &std::sync::Arc<crate::metrics::NbdMetrics>,
) -> Result<(), ConnError>
where
    R: AsyncRead + Unpin,
    W: AsyncWrite + Unpin,
{
    let (tx, rx) = mpsc::channel::<Outgoing>(limits.max_in_flight.max(1));
    let slots = Arc::new(Semaphore::new(limits.max_in_flight.max(1)));
    let reader = read_requests(r, session, limits, slots.clone(), tx, stopping, metrics);
    let writer = write_replies(
        w,
        rx,
        InFlight {
            slots,
            max: limits.max_in_flight.max(1),
        },
    );
    tokio::pin!(writer);
    tokio::select! {
        res = reader => {
            // The reader dropped its sender; the writer ends once the last in-flight request
            // has been answered.
            let written = writer.await;
            res.and(written)
        }
        // The writer ends early only when the socket fails; stop reading too.
        res = &mut writer => res,
    }
}

/// The connection's request slots, to tell whether requests are still being worked on.
struct InFlight {
    slots: Arc<Semaphore>,
    max: usize,
}

impl InFlight {
    /// Requests holding a slot: being worked on, or with a reply not yet written.
    fn count(&self) -> usize {
        self.max - self.slots.available_permits()
    }
}

async fn write_replies<W: AsyncWrite + Unpin>(
    w: W,
    mut rx: mpsc::Receiver<Outgoing>,
    in_flight: InFlight,
) -> Result<(), ConnError> {
    let mut w = BufWriter::with_capacity(256 << 10, w);
    while let Some(first) = rx.recv().await {
        let mut written = 0;
        let mut next = Some(first);
        loop {
            while let Some(out) = next {
                w.write_all(&out.head).await?;
                if !out.data.is_empty() {
                    w.write_all(&out.data).await?;
                }
                drop(out);
                written += 1;
                next = rx.try_recv().ok();
            }
            // Other requests still hold slots (the replies just written have released
            // theirs): let them run once, so replies that are about to be ready go out in
            // this send rather than each in one of their own. Only once per send, so a
            // request waiting for the cluster delays the others by one scheduler pass at most.
            if written > 1 || in_flight.count() == 0 {
                break;
            }
            tokio::task::yield_now().await;
            next = rx.try_recv().ok();
            if next.is_none() {
                break;
            }
        }
        w.flush().await?;
    }
    w.shutdown().await.ok();
    Ok(())
}

async fn stopped(rx: &mut watch::Receiver<bool>) {
    if rx.wait_for(|s| *s).await.is_err() {
        // The server is gone without saying stop: nothing will ever say it now.
        std::future::pending::<()>().await;
    }
}

async fn read_requests<R: AsyncRead + Unpin>(
    r: &mut R,
    session: Session,
    limits: Limits,
    slots: Arc<Semaphore>,
    tx: mpsc::Sender<Outgoing>,
    mut stopping: watch::Receiver<bool>,
    metrics: &Arc<crate::metrics::NbdMetrics>,
) -> Result<(), ConnError> {
    let bytes = Arc::new(Semaphore::new(limits.max_in_flight_bytes as usize));
    let n = session.negotiated;
    let structured = n.structured;
    loop {
        let mut hdr = [0u8; wire::REQUEST_HEADER_LEN];
        tokio::select! {
            biased;
            () = stopped(&mut stopping) => {
                debug!(export = %session.export, "server stopping: closing after in-flight requests");
                return Ok(());
            }
            res = r.read_exact(&mut hdr) => match res {
                Ok(_) => {}
                Err(e) if e.kind() == std::io::ErrorKind::UnexpectedEof => {
                    debug!(export = %session.export, "client closed the connection");
                    return Ok(());
                }
                Err(e) => return Err(e.into()),
            },
        }
        let h = wire::RequestHeader::decode(&hdr)?;
        trace!(cmd = %wire::CmdName(h.typ), handle = h.handle, offset = h.offset, len = h.len, "request");
        let checked = check_request(h.typ, h.flags, h.offset, h.len, &n);
        let slot = slots
            .clone()
            .acquire_owned()
            .await
            .expect("the semaphore is never closed");
        let cmd = match checked.outcome {
            Ok(cmd) => cmd,
            Err(rej) => {
                debug!(export = %session.export, cmd = %wire::CmdName(h.typ), offset = h.offset,
                       len = h.len, errno = rej.errno, reason = %rej.reason, "request rejected");
                // A rejected write's payload is consumed *before* the error is sent: clients
                // (libnbd) do not expect a reply to a request they are still sending.
                if let Payload::Discard(len) = checked.payload {
                    discard(r, len).await?;
                }
                let head = error_reply(h.handle, rej.errno, &rej.reason, structured);
                if tx
                    .send(Outgoing {
                        head,
                        data: Bytes::new(),
                        _slot: slot,
                        _bytes: None,
                    })
                    .await
                    .is_err()
                {
                    return Ok(());
                }
                if checked.payload == Payload::Disconnect {
                    return Err(ConnError::OversizedWrite(h.len));
                }
                continue;
            }
        };
        let (data, bytes_permit) = match cmd {
            Command::Disconnect => {
                debug!(export = %session.export, "client sent NBD_CMD_DISC");
                return Ok(());
            }
            Command::Write { len, .. } => {
                let permit = bytes
                    .clone()
                    .acquire_many_owned(len)
                    .await
                    .expect("the semaphore is never closed");
                (read_payload(r, len).await?, Some(permit))
            }
            Command::Read { len, .. } => {
                let permit = bytes
                    .clone()
                    .acquire_many_owned(len)
                    .await
                    .expect("the semaphore is never closed");
                (Bytes::new(), Some(permit))
            }
            _ => (Bytes::new(), None),
        };
        let mut guard = ReplyGuard {
            tx: tx.clone(),
            handle: h.handle,
            structured,
            slot: Some(slot),
            bytes: bytes_permit,
        };
        let device = session.device.clone();
        let timer = metrics.request(&cmd);
        tokio::spawn(async move {
            let (head, data) = execute(&*device, cmd, data, h.handle, structured).await;
            timer.done();
            guard.send(head, data).await;
        });
    }
}

/// Sends a request's reply; if the request's task dies first (a panicking device), sends
/// `EIO` instead so the client is never left waiting for the handle.
struct ReplyGuard {
    tx: mpsc::Sender<Outgoing>,
    handle: u64,
    structured: bool,
    slot: Option<OwnedSemaphorePermit>,
    bytes: Option<OwnedSemaphorePermit>,
}

impl ReplyGuard {
    async fn send(&mut self, head: Vec<u8>, data: Bytes) {
        if let Some(slot) = self.slot.take() {
            let _ = self
                .tx
                .send(Outgoing {
                    head,
                    data,
                    _slot: slot,
                    _bytes: self.bytes.take(),
                })
                .await;
        }
    }
}

impl Drop for ReplyGuard {
    fn drop(&mut self) {
        if let Some(slot) = self.slot.take() {
            let head = error_reply(
                self.handle,
                errno::EIO,
                "internal error in the device",
                self.structured,
            );
            // Cannot be full: the channel holds as many messages as there are slots, and this
            // request still owns its slot.
            let _ = self.tx.try_send(Outgoing {
                head,
                data: Bytes::new(),
                _slot: slot,
                _bytes: None,
            });
        }
    }
}

async fn read_payload<R: AsyncRead + Unpin>(r: &mut R, len: u32) -> Result<Bytes, ConnError> {
    let len = len as usize;
    let mut buf = BytesMut::with_capacity(len);
    let mut limited = (&mut *r).take(len as u64);
    while buf.len() < len {
        if limited.read_buf(&mut buf).await? == 0 {
            return Err(std::io::Error::from(std::io::ErrorKind::UnexpectedEof).into());
        }
    }
    Ok(buf.freeze())
}

async fn discard<R: AsyncRead + Unpin>(r: &mut R, len: u32) -> Result<(), ConnError> {
    let copied =
        tokio::io::copy(&mut (&mut *r).take(u64::from(len)), &mut tokio::io::sink()).await?;
    if copied != u64::from(len) {
        return Err(std::io::Error::from(std::io::ErrorKind::UnexpectedEof).into());
    }
    Ok(())
}

/// Encodes an error reply: a structured `NBD_REPLY_TYPE_ERROR` chunk with a message when
/// structured replies were negotiated, else a simple reply (no payload follows).
pub fn error_reply(handle: u64, errno: u32, message: &str, structured: bool) -> Vec<u8> {
    if structured {
        let payload = wire::error_payload(errno, message);
        let len = u32::try_from(payload.len()).expect("error payloads are bounded");
        let mut v = wire::chunk_header(reply::FLAG_DONE, reply::TYPE_ERROR, handle, len).to_vec();
        v.extend_from_slice(&payload);
        v
    } else {
        wire::simple_reply(errno, handle).to_vec()
    }
}

fn ok_reply(handle: u64) -> Vec<u8> {
    wire::simple_reply(0, handle).to_vec()
}

fn device_error(handle: u64, e: &DeviceError, structured: bool) -> Vec<u8> {
    debug!(handle, error = %e, "device error");
    error_reply(handle, e.errno(), &e.to_string(), structured)
}

fn is_zero(data: &[u8]) -> bool {
    data.chunks(4096)
        .all(|c| c.iter().fold(0u8, |acc, b| acc | b) == 0)
}

/// Encodes a successful read: one `OFFSET_HOLE` chunk if the data is all zeros, else one
/// `OFFSET_DATA` chunk (structured), or the simple reply followed by the data.
pub fn read_reply(handle: u64, offset: u64, data: Bytes, structured: bool) -> (Vec<u8>, Bytes) {
    if !structured {
        return (wire::simple_reply(0, handle).to_vec(), data);
    }
    let len = u32::try_from(data.len()).expect("reads are at most the payload limit");
    if is_zero(&data) {
        let mut v =
            wire::chunk_header(reply::FLAG_DONE, reply::TYPE_OFFSET_HOLE, handle, 12).to_vec();
        v.extend_from_slice(&wire::hole_payload(offset, len));
        return (v, Bytes::new());
    }
    let mut v =
        wire::chunk_header(reply::FLAG_DONE, reply::TYPE_OFFSET_DATA, handle, len + 8).to_vec();
    v.extend_from_slice(&offset.to_be_bytes());
    (v, data)
}

/// Turns a device's extents into `base:allocation` descriptors for a request of `len` bytes:
/// cut to the request, empty extents dropped, neighbours with equal flags merged, at most
/// [`MAX_EXTENTS_PER_REPLY`] (one with `req_one`).
pub fn descriptors(extents: &[Extent], len: u32, req_one: bool) -> Vec<(u32, u32)> {
    let limit = if req_one { 1 } else { MAX_EXTENTS_PER_REPLY };
    let mut remaining = u64::from(len);
    let mut out: Vec<(u32, u32)> = Vec::new();
    for e in extents {
        if remaining == 0 {
            break;
        }
        let l = e.len.min(remaining);
        if l == 0 {
            continue;
        }
        remaining -= l;
        let l = u32::try_from(l).expect("cut to the request's 32-bit length");
        let flags = (if e.hole { wire::STATE_HOLE } else { 0 })
            | (if e.zero { wire::STATE_ZERO } else { 0 });
        if let Some(last) = out.last_mut().filter(|last| last.1 == flags) {
            last.0 += l;
        } else if out.len() == limit {
            break;
        } else {
            out.push((l, flags));
        }
    }
    out
}

async fn execute(
    device: &dyn BlockDevice,
    cmd: Command,
    data: Bytes,
    handle: u64,
    structured: bool,
) -> (Vec<u8>, Bytes) {
    let done = |res: Result<(), DeviceError>| match res {
        Ok(()) => (ok_reply(handle), Bytes::new()),
        Err(e) => (device_error(handle, &e, structured), Bytes::new()),
    };
    match cmd {
        Command::Read { offset, len, .. } => match device.read(offset, len).await {
            Ok(d) if d.len() == len as usize => read_reply(handle, offset, d, structured),
            Ok(d) => {
                let e = DeviceError::Io(format!(
                    "device returned {} bytes for a read of {len}",
                    d.len()
                ));
                (device_error(handle, &e, structured), Bytes::new())
            }
            Err(e) => (device_error(handle, &e, structured), Bytes::new()),
        },
        Command::Write { offset, fua, .. } => done(device.write(offset, data, fua).await),
        Command::Flush => done(device.flush().await),
        Command::Trim { offset, len, fua } => {
            let res = device.trim(offset, len).await;
            done(if fua && res.is_ok() {
                device.flush().await
            } else {
                res
            })
        }
        Command::WriteZeroes {
            offset,
            len,
            fua,
            no_hole,
        } => {
            let res = device.write_zeroes(offset, len, no_hole).await;
            done(if fua && res.is_ok() {
                device.flush().await
            } else {
                res
            })
        }
        Command::BlockStatus {
            offset,
            len,
            req_one,
        } => match device.block_status(offset, len).await {
            Ok(extents) => {
                let d = descriptors(&extents, len, req_one);
                if d.is_empty() {
                    let e = DeviceError::Io("device reported no extents".into());
                    return (device_error(handle, &e, structured), Bytes::new());
                }
                let payload = wire::block_status_payload(BASE_ALLOCATION_ID, &d);
                let plen = u32::try_from(payload.len())
                    .expect("at most MAX_EXTENTS_PER_REPLY descriptors");
                let mut v =
                    wire::chunk_header(reply::FLAG_DONE, reply::TYPE_BLOCK_STATUS, handle, plen)
                        .to_vec();
                v.extend_from_slice(&payload);
                (v, Bytes::new())
            }
            Err(e) => (device_error(handle, &e, structured), Bytes::new()),
        },
        // A hint; the devices have no cache worth warming.
        Command::Cache { .. } => (ok_reply(handle), Bytes::new()),
        Command::Disconnect => unreachable!("handled by the reader"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ext(len: u64, hole: bool) -> Extent {
        Extent {
            len,
            hole,
            zero: hole,
        }
    }

    #[test]
    fn descriptors_are_cut_merged_and_bounded() {
        let e = [
            ext(100, false),
            ext(50, false),
            ext(0, true),
            ext(200, true),
            ext(1000, false),
        ];
        assert_eq!(
            descriptors(&e, 400, false),
            vec![(150, 0), (200, 3), (50, 0)]
        );
        assert_eq!(descriptors(&e, 120, false), vec![(120, 0)]);
        assert_eq!(descriptors(&e, 400, true), vec![(150, 0)]);
        assert_eq!(descriptors(&[], 10, false), vec![]);
        let many: Vec<Extent> = (0..(MAX_EXTENTS_PER_REPLY + 10))
            .map(|i| ext(1, i % 2 == 0))
            .collect();
        let d = descriptors(&many, u32::MAX, false);
        assert_eq!(d.len(), MAX_EXTENTS_PER_REPLY);
        assert!(d.iter().all(|(l, _)| *l == 1));
        // Extents longer than 32 bits are cut to the request.
        assert_eq!(
            descriptors(&[ext(u64::MAX, true)], u32::MAX, false),
            vec![(u32::MAX, 3)]
        );
    }

    #[test]
    fn read_replies() {
        let (h, d) = read_reply(7, 4096, Bytes::from_static(&[0, 0, 0]), true);
        assert_eq!(&h[6..8], &reply::TYPE_OFFSET_HOLE.to_be_bytes());
        assert_eq!(&h[16..20], &12u32.to_be_bytes());
        assert_eq!(&h[20..28], &4096u64.to_be_bytes());
        assert_eq!(&h[28..32], &3u32.to_be_bytes());
        assert!(d.is_empty());
        let (h, d) = read_reply(7, 4096, Bytes::from_static(&[0, 1, 0]), true);
        assert_eq!(&h[6..8], &reply::TYPE_OFFSET_DATA.to_be_bytes());
        assert_eq!(&h[16..20], &11u32.to_be_bytes());
        assert_eq!(h.len(), 28);
        assert_eq!(&d[..], &[0, 1, 0]);
        let (h, d) = read_reply(7, 0, Bytes::from_static(&[0]), false);
        assert_eq!(h, wire::simple_reply(0, 7));
        assert_eq!(&d[..], &[0]);
    }

    #[test]
    fn error_replies() {
        assert_eq!(
            error_reply(3, errno::EINVAL, "x", false),
            wire::simple_reply(22, 3)
        );
        let s = error_reply(3, errno::EINVAL, "x", true);
        assert_eq!(&s[4..8], &[0, 1, 0x80, 1]);
        assert_eq!(&s[20..], &[0, 0, 0, 22, 0, 1, b'x']);
    }
}
