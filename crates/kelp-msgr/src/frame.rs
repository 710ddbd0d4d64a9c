//! The frame: the unit that crosses an authenticated connection.
//!
//! Hot path (every message goes through [`encode_header`] and [`read_frame`]).
//!
//! Layout (all integers little-endian), see `docs/MESSENGER.md`:
//!
//! | offset | size | field |
//! |---|---|---|
//! | 0 | 2 | magic `"KL"` |
//! | 2 | 1 | frame format version (1) |
//! | 3 | 1 | flags: kind (request / response / one-way / keepalive) + error bit |
//! | 4 | 2 | `msg_type` |
//! | 6 | 2 | reserved, must be 0 |
//! | 8 | 8 | `tid` |
//! | 16 | 4 | `meta_len` |
//! | 20 | 4 | `data_len` |
//! | 24 | 4 | crc32c over bytes 0..24, then meta, then data |
//!
//! Invariants kept here:
//! - nothing is allocated for a segment before its length has been checked against the limits;
//! - each segment is read into exactly one `BytesMut` (large ones starting 4 KiB-aligned) and frozen, so the data
//!   segment handed to the user is the buffer the socket wrote into (no copy);
//! - a frame is handed out only after its crc32c has been verified.

use std::ops::Deref;
use std::time::Duration;

use bytes::{BufMut, Bytes, BytesMut};
use tokio::io::{AsyncRead, AsyncReadExt};

use crate::error::FrameError;
use crate::segpool;

/// First two bytes of every frame.
pub const MAGIC: [u8; 2] = *b"KL";
/// The frame format this build writes and the only one it reads.
pub const FRAME_VERSION: u8 = 1;
/// Size of the fixed header.
pub const HEADER_LEN: usize = 28;

/// Flag bit: a request that expects a response with the same tid.
pub const FLAG_REQUEST: u8 = 0x01;
/// Flag bit: the response to the request with the same tid.
pub const FLAG_RESPONSE: u8 = 0x02;
/// Flag bit: a one-way message (no response; tid is informational).
pub const FLAG_ONEWAY: u8 = 0x04;
/// Flag bit (only with [`FLAG_RESPONSE`]): the response is an error; meta holds
/// `code: u32 LE` followed by a UTF-8 message.
pub const FLAG_ERROR: u8 = 0x08;
/// Flag bit: a keepalive (no segments; `msg_type` and `tid` are 0 and ignored). Sent when a
/// connection is otherwise quiet so each end can tell a silent peer from a dead path.
pub const FLAG_KEEPALIVE: u8 = 0x10;

/// What a frame is, decoded from its flags byte.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FrameKind {
    Request,
    Response,
    ErrorResponse,
    OneWay,
    Keepalive,
}

impl FrameKind {
    /// The flags byte for this kind.
    pub fn flags(self) -> u8 {
        match self {
            FrameKind::Request => FLAG_REQUEST,
            FrameKind::Response => FLAG_RESPONSE,
            FrameKind::ErrorResponse => FLAG_RESPONSE | FLAG_ERROR,
            FrameKind::OneWay => FLAG_ONEWAY,
            FrameKind::Keepalive => FLAG_KEEPALIVE,
        }
    }

    /// Decodes a flags byte; only the four combinations above are valid.
    pub fn from_flags(flags: u8) -> Result<Self, FrameError> {
        match flags {
            FLAG_REQUEST => Ok(FrameKind::Request),
            FLAG_RESPONSE => Ok(FrameKind::Response),
            f if f == FLAG_RESPONSE | FLAG_ERROR => Ok(FrameKind::ErrorResponse),
            FLAG_ONEWAY => Ok(FrameKind::OneWay),
            FLAG_KEEPALIVE => Ok(FrameKind::Keepalive),
            _ => Err(FrameError::BadFlags { flags }),
        }
    }
}

/// A decoded, checksum-verified frame.
#[derive(Clone, Debug)]
pub struct Frame {
    pub kind: FrameKind,
    pub msg_type: u16,
    pub tid: u64,
    pub meta: Bytes,
    pub data: Bytes,
}

/// Size limits applied to incoming frames before anything is allocated.
#[derive(Clone, Copy, Debug)]
pub struct Limits {
    pub max_meta_len: u32,
    pub max_data_len: u32,
}

/// Builds the 28-byte header for a frame, including the crc32c over header, meta and data.
///
/// The caller must have checked `meta.len()` and `data.len()` against its limits (they must fit
/// in `u32`); lengths that do not fit are a programming error and are clamped by the caller's
/// check, never here.
pub fn encode_header(
    kind: FrameKind,
    msg_type: u16,
    tid: u64,
    meta: &[u8],
    data: &[u8],
) -> [u8; HEADER_LEN] {
    let mut h = [0u8; HEADER_LEN];
    h[0..2].copy_from_slice(&MAGIC);
    h[2] = FRAME_VERSION;
    h[3] = kind.flags();
    h[4..6].copy_from_slice(&msg_type.to_le_bytes());
    // h[6..8] reserved = 0
    h[8..16].copy_from_slice(&tid.to_le_bytes());
    h[16..20].copy_from_slice(&(meta.len() as u32).to_le_bytes());
    h[20..24].copy_from_slice(&(data.len() as u32).to_le_bytes());
    let crc = kelp_types::crc32c_append(kelp_types::crc32c(&h[0..24]), meta);
    let crc = kelp_types::crc32c_append(crc, data);
    h[24..28].copy_from_slice(&crc.to_le_bytes());
    h
}

/// The fields of a header that passed validation.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Header {
    pub kind: FrameKind,
    pub msg_type: u16,
    pub tid: u64,
    pub meta_len: u32,
    pub data_len: u32,
    pub crc: u32,
}

/// Validates a raw header against the format and the limits. Pure: no I/O.
pub fn decode_header(h: &[u8; HEADER_LEN], limits: Limits) -> Result<Header, FrameError> {
    let magic = [h[0], h[1]];
    if magic != MAGIC {
        return Err(FrameError::BadMagic { found: magic });
    }
    if h[2] != FRAME_VERSION {
        return Err(FrameError::UnsupportedVersion {
            found: h[2],
            supported: FRAME_VERSION,
        });
    }
    let kind = FrameKind::from_flags(h[3])?;
    let reserved = u16::from_le_bytes([h[6], h[7]]);
    if reserved != 0 {
        return Err(FrameError::Reserved { value: reserved });
    }
    let u32_at = |o: usize| u32::from_le_bytes([h[o], h[o + 1], h[o + 2], h[o + 3]]);
    let meta_len = u32_at(16);
    let data_len = u32_at(20);
    if meta_len > limits.max_meta_len {
        return Err(FrameError::MetaTooLarge {
            len: meta_len,
            max: limits.max_meta_len,
        });
    }
    if data_len > limits.max_data_len {
        return Err(FrameError::DataTooLarge {
            len: data_len,
            max: limits.max_data_len,
        });
    }
    let mut tid = [0u8; 8];
    tid.copy_from_slice(&h[8..16]);
    Ok(Header {
        kind,
        msg_type: u16::from_le_bytes([h[4], h[5]]),
        tid: u64::from_le_bytes(tid),
        meta_len,
        data_len,
        crc: u32_at(24),
    })
}

/// Reads one frame. `Ok(None)` means the peer closed the stream cleanly between frames.
///
/// There is no deadline for the header (an idle connection is normal); once a header has
/// arrived, its body must arrive within `body_timeout`.
pub async fn read_frame<R: AsyncRead + Unpin>(
    r: &mut R,
    limits: Limits,
    body_timeout: Duration,
) -> Result<Option<Frame>, FrameError> {
    match read_header(r, limits).await? {
        None => Ok(None),
        Some((raw, header)) => read_body(r, &raw, header, body_timeout).await.map(Some),
    }
}

/// First half of [`read_frame`]: waits (without deadline) for a header and validates it.
/// Returns the raw bytes too, for the crc. `Ok(None)`: clean end of stream.
pub async fn read_header<R: AsyncRead + Unpin>(
    r: &mut R,
    limits: Limits,
) -> Result<Option<([u8; HEADER_LEN], Header)>, FrameError> {
    let mut raw = [0u8; HEADER_LEN];
    let mut got = 0;
    while got < HEADER_LEN {
        let n = r.read(&mut raw[got..]).await?;
        if n == 0 {
            if got == 0 {
                return Ok(None);
            }
            return Err(FrameError::Truncated {
                what: "header",
                got,
                expected: HEADER_LEN,
            });
        }
        got += n;
    }
    let header = decode_header(&raw, limits)?;
    Ok(Some((raw, header)))
}

/// Second half of [`read_frame`]: reads the segments within `body_timeout` and checks the crc.
pub async fn read_body<R: AsyncRead + Unpin>(
    r: &mut R,
    raw: &[u8; HEADER_LEN],
    header: Header,
    body_timeout: Duration,
) -> Result<Frame, FrameError> {
    let body = async {
        let meta = read_segment(r, header.meta_len as usize, "meta").await?;
        let data = read_segment(r, header.data_len as usize, "data").await?;
        Ok::<_, FrameError>((meta, data))
    };
    let (meta, data) = tokio::time::timeout(body_timeout, body)
        .await
        .map_err(|_| FrameError::BodyTimeout {
            after: body_timeout,
        })??;
    let crc = kelp_types::crc32c_append(kelp_types::crc32c(&raw[0..24]), &meta);
    let crc = kelp_types::crc32c_append(crc, &data);
    if crc != header.crc {
        return Err(FrameError::BadCrc {
            expected: header.crc,
            computed: crc,
        });
    }
    Ok(Frame {
        kind: header.kind,
        msg_type: header.msg_type,
        tid: header.tid,
        meta,
        data,
    })
}

/// Segments at least this large start at a [`SEGMENT_ALIGN`]-aligned address and come from the
/// buffer pool (one threshold for both: the pool's).
const ALIGN_FROM: usize = segpool::POOL_FROM;
/// Alignment of large received segments: the object store writes a payload that starts on a
/// 4 KiB boundary straight to the device (`O_DIRECT`) instead of copying it to an aligned
/// buffer first.
pub const SEGMENT_ALIGN: usize = 4096;

/// Reads exactly `len` bytes into one allocation (no zero-fill, no later copy). Segments of
/// [`ALIGN_FROM`] bytes or more start on a [`SEGMENT_ALIGN`] boundary of their allocation and
/// are read into a reused buffer (`segpool`), which goes back to the pool when the last `Bytes`
/// referring to it is dropped.
async fn read_segment<R: AsyncRead + Unpin>(
    r: &mut R,
    len: usize,
    what: &'static str,
) -> Result<Bytes, FrameError> {
    if len >= ALIGN_FROM {
        let mut buf = segpool::take(len + SEGMENT_ALIGN);
        let pad = buf.as_ptr().align_offset(SEGMENT_ALIGN);
        buf.resize(pad, 0);
        let filled = read_into(r, &mut buf, pad + len, what).await;
        return match filled {
            Ok(()) => Ok(segpool::PooledSegment::into_bytes(buf, pad)),
            Err(e) => {
                segpool::give(buf);
                Err(e)
            }
        };
    }
    let mut buf = BytesMut::with_capacity(len);
    read_into(r, &mut buf, len, what).await?;
    Ok(buf.freeze())
}

/// Reads into `buf` until it holds `total` bytes (within its capacity: no reallocation).
async fn read_into<R: AsyncRead + Unpin, B: BufMut + Deref<Target = [u8]>>(
    r: &mut R,
    buf: &mut B,
    total: usize,
    what: &'static str,
) -> Result<(), FrameError> {
    let start = buf.len();
    while buf.len() < total {
        let remaining = total - buf.len();
        let n = r.read_buf(&mut buf.limit(remaining)).await?;
        if n == 0 {
            return Err(FrameError::Truncated {
                what,
                got: buf.len() - start,
                expected: total - start,
            });
        }
    }
    Ok(())
}

/// Encodes the meta segment of an error response: `code: u32 LE` + UTF-8 message.
pub fn encode_error_meta(code: u32, message: &str) -> Bytes {
    let mut b = BytesMut::with_capacity(4 + message.len());
    b.put_u32_le(code);
    b.put_slice(message.as_bytes());
    b.freeze()
}

/// Decodes an error response's meta segment; a malformed one still yields an error (never a
/// panic), with the bytes shown lossily.
pub fn decode_error_meta(meta: &[u8]) -> (u32, String) {
    if meta.len() < 4 {
        return (
            crate::code::MALFORMED_ERROR,
            format!("malformed error reply ({} bytes)", meta.len()),
        );
    }
    let code = u32::from_le_bytes([meta[0], meta[1], meta[2], meta[3]]);
    (code, String::from_utf8_lossy(&meta[4..]).into_owned())
}

#[cfg(test)]
mod tests {
    use super::*;

    const LIMITS: Limits = Limits {
        max_meta_len: 1024,
        max_data_len: 1 << 20,
    };

    fn encode(kind: FrameKind, meta: &[u8], data: &[u8]) -> Vec<u8> {
        let mut v = encode_header(kind, 7, 42, meta, data).to_vec();
        v.extend_from_slice(meta);
        v.extend_from_slice(data);
        v
    }

    async fn read(bytes: &[u8]) -> Result<Option<Frame>, FrameError> {
        let mut r = bytes;
        read_frame(&mut r, LIMITS, Duration::from_secs(1)).await
    }

    #[tokio::test]
    async fn round_trip() {
        let wire = encode(FrameKind::Request, b"meta", b"some data");
        let f = read(&wire).await.unwrap().unwrap();
        assert_eq!(f.kind, FrameKind::Request);
        assert_eq!((f.msg_type, f.tid), (7, 42));
        assert_eq!(&f.meta[..], b"meta");
        assert_eq!(&f.data[..], b"some data");
    }

    #[tokio::test]
    async fn large_data_segments_start_aligned() {
        for len in [ALIGN_FROM, 300_001, 1 << 20] {
            let data: Vec<u8> = (0..len).map(|i| (i * 7 % 251) as u8).collect();
            let wire = encode(FrameKind::Request, b"m", &data);
            let f = read(&wire).await.unwrap().unwrap();
            assert_eq!(
                f.data.as_ptr().align_offset(SEGMENT_ALIGN),
                0,
                "{len} bytes"
            );
            assert_eq!(&f.data[..], &data[..]);
        }
    }

    #[tokio::test]
    async fn empty_stream_is_clean_eof() {
        assert!(read(&[]).await.unwrap().is_none());
    }

    #[tokio::test]
    async fn every_flipped_bit_is_caught() {
        let wire = encode(FrameKind::OneWay, b"abc", b"defgh");
        for byte in 0..wire.len() {
            for bit in 0..8 {
                let mut w = wire.clone();
                w[byte] ^= 1 << bit;
                assert!(read(&w).await.is_err(), "flip at {byte}.{bit} accepted");
            }
        }
    }

    #[tokio::test]
    async fn truncation_at_every_point_is_an_error() {
        let wire = encode(FrameKind::Response, b"abc", b"defgh");
        for cut in 1..wire.len() {
            match read(&wire[..cut]).await {
                Err(FrameError::Truncated { .. }) => {}
                other => panic!("cut at {cut}: {other:?}"),
            }
        }
    }

    #[tokio::test]
    async fn oversized_lengths_refused_before_reading() {
        let mut h = encode_header(FrameKind::Request, 1, 1, b"", b"");
        h[20..24].copy_from_slice(&u32::MAX.to_le_bytes());
        assert!(matches!(
            read(&h).await,
            Err(FrameError::DataTooLarge { len: u32::MAX, .. })
        ));
        let mut h = encode_header(FrameKind::Request, 1, 1, b"", b"");
        h[16..20].copy_from_slice(&2000u32.to_le_bytes());
        assert!(matches!(
            read(&h).await,
            Err(FrameError::MetaTooLarge { len: 2000, .. })
        ));
    }

    #[test]
    fn flags() {
        for k in [
            FrameKind::Request,
            FrameKind::Response,
            FrameKind::ErrorResponse,
            FrameKind::OneWay,
            FrameKind::Keepalive,
        ] {
            assert_eq!(FrameKind::from_flags(k.flags()).unwrap(), k);
        }
        for bad in [0u8, 0x03, 0x05, 0x09, 0x0c, 0x11, 0x18, 0x20, 0xff] {
            assert!(FrameKind::from_flags(bad).is_err(), "{bad:#x}");
        }
    }

    #[test]
    fn error_meta() {
        let m = encode_error_meta(17, "nope");
        assert_eq!(decode_error_meta(&m), (17, "nope".to_string()));
        assert_eq!(decode_error_meta(b"x").0, crate::code::MALFORMED_ERROR);
    }
}
