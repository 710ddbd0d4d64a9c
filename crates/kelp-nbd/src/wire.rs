//! The NBD wire format: constants, fixed-size headers and the option payloads, encoded and
//! decoded by pure functions (no I/O) so that unit tests and the fuzz test drive exactly the
//! code the server runs. Everything is big-endian ("network byte order") as the protocol says.
//!
//! Only the fixed-newstyle handshake and compact (32-bit length) requests are spoken; extended
//! headers are not offered.

use std::fmt;

/// `NBDMAGIC`, the first 8 bytes the server sends.
pub const NBD_MAGIC: u64 = 0x4e42_444d_4147_4943;
/// `IHAVEOPT`: the newstyle magic, and the magic in front of every client option.
pub const IHAVEOPT: u64 = 0x4948_4156_454f_5054;
/// Magic in front of every option reply.
pub const OPTION_REPLY_MAGIC: u64 = 0x0003_e889_0455_65a9;
/// Magic of a transmission request.
pub const REQUEST_MAGIC: u32 = 0x2560_9513;
/// Magic of a simple reply.
pub const SIMPLE_REPLY_MAGIC: u32 = 0x6744_6698;
/// Magic of a structured reply chunk.
pub const STRUCTURED_REPLY_MAGIC: u32 = 0x668e_33ef;

/// Handshake flags (server → client).
pub const FLAG_FIXED_NEWSTYLE: u16 = 1 << 0;
/// Handshake flag: the 124 zero bytes after `NBD_OPT_EXPORT_NAME` may be omitted.
pub const FLAG_NO_ZEROES: u16 = 1 << 1;
/// Client flags (client → server).
pub const FLAG_C_FIXED_NEWSTYLE: u32 = 1 << 0;
/// Client flag: do not send the 124 zero bytes.
pub const FLAG_C_NO_ZEROES: u32 = 1 << 1;

/// Transmission flags.
pub mod tflag {
    pub const HAS_FLAGS: u16 = 1 << 0;
    pub const READ_ONLY: u16 = 1 << 1;
    pub const SEND_FLUSH: u16 = 1 << 2;
    pub const SEND_FUA: u16 = 1 << 3;
    pub const ROTATIONAL: u16 = 1 << 4;
    pub const SEND_TRIM: u16 = 1 << 5;
    pub const SEND_WRITE_ZEROES: u16 = 1 << 6;
    pub const SEND_DF: u16 = 1 << 7;
    pub const CAN_MULTI_CONN: u16 = 1 << 8;
    pub const SEND_RESIZE: u16 = 1 << 9;
    pub const SEND_CACHE: u16 = 1 << 10;
    pub const SEND_FAST_ZERO: u16 = 1 << 11;
}

/// Option numbers.
pub mod opt {
    pub const EXPORT_NAME: u32 = 1;
    pub const ABORT: u32 = 2;
    pub const LIST: u32 = 3;
    pub const STARTTLS: u32 = 5;
    pub const INFO: u32 = 6;
    pub const GO: u32 = 7;
    pub const STRUCTURED_REPLY: u32 = 8;
    pub const LIST_META_CONTEXT: u32 = 9;
    pub const SET_META_CONTEXT: u32 = 10;
}

/// Option reply types.
pub mod rep {
    pub const ACK: u32 = 1;
    pub const SERVER: u32 = 2;
    pub const INFO: u32 = 3;
    pub const META_CONTEXT: u32 = 4;
    pub const ERR_UNSUP: u32 = (1 << 31) + 1;
    pub const ERR_POLICY: u32 = (1 << 31) + 2;
    pub const ERR_INVALID: u32 = (1 << 31) + 3;
    pub const ERR_PLATFORM: u32 = (1 << 31) + 4;
    pub const ERR_TLS_REQD: u32 = (1 << 31) + 5;
    pub const ERR_UNKNOWN: u32 = (1 << 31) + 6;
    pub const ERR_SHUTDOWN: u32 = (1 << 31) + 7;
    pub const ERR_BLOCK_SIZE_REQD: u32 = (1 << 31) + 8;
    pub const ERR_TOO_BIG: u32 = (1 << 31) + 9;
}

/// `NBD_INFO_*` types in `NBD_OPT_INFO`/`NBD_OPT_GO` and `NBD_REP_INFO`.
pub mod info {
    pub const EXPORT: u16 = 0;
    pub const NAME: u16 = 1;
    pub const DESCRIPTION: u16 = 2;
    pub const BLOCK_SIZE: u16 = 3;
}

/// Request types.
pub mod cmd {
    pub const READ: u16 = 0;
    pub const WRITE: u16 = 1;
    pub const DISC: u16 = 2;
    pub const FLUSH: u16 = 3;
    pub const TRIM: u16 = 4;
    pub const CACHE: u16 = 5;
    pub const WRITE_ZEROES: u16 = 6;
    pub const BLOCK_STATUS: u16 = 7;
}

/// Command flags.
pub mod cmd_flag {
    pub const FUA: u16 = 1 << 0;
    pub const NO_HOLE: u16 = 1 << 1;
    pub const DF: u16 = 1 << 2;
    pub const REQ_ONE: u16 = 1 << 3;
    pub const FAST_ZERO: u16 = 1 << 4;
}

/// Structured reply chunk types and flags.
pub mod reply {
    pub const FLAG_DONE: u16 = 1 << 0;
    pub const TYPE_NONE: u16 = 0;
    pub const TYPE_OFFSET_DATA: u16 = 1;
    pub const TYPE_OFFSET_HOLE: u16 = 2;
    pub const TYPE_BLOCK_STATUS: u16 = 5;
    pub const TYPE_ERROR: u16 = (1 << 15) + 1;
    pub const TYPE_ERROR_OFFSET: u16 = (1 << 15) + 2;
}

/// `base:allocation` status bits.
pub const STATE_HOLE: u32 = 1 << 0;
/// Reads as zeros.
pub const STATE_ZERO: u32 = 1 << 1;

/// The one metadata context this server offers.
pub const BASE_ALLOCATION: &str = "base:allocation";

/// NBD error numbers (the protocol fixes these values, whatever the host's errno).
pub mod errno {
    pub const EPERM: u32 = 1;
    pub const EIO: u32 = 5;
    pub const ENOMEM: u32 = 12;
    pub const EINVAL: u32 = 22;
    pub const ENOSPC: u32 = 28;
    pub const EOVERFLOW: u32 = 75;
    pub const ENOTSUP: u32 = 95;
    pub const ESHUTDOWN: u32 = 108;
}

/// Longest string (export name, query, message) the protocol allows.
pub const MAX_STRING: usize = 4096;
/// Size of a transmission request header.
pub const REQUEST_HEADER_LEN: usize = 28;
/// Size of an option header (magic, option, length).
pub const OPTION_HEADER_LEN: usize = 16;

/// A malformed fixed-size header: the connection cannot be resynchronised.
#[derive(thiserror::Error, Debug, PartialEq, Eq)]
pub enum HeaderError {
    #[error("bad request magic {0:#010x}")]
    RequestMagic(u32),
    #[error("bad option magic {0:#018x}")]
    OptionMagic(u64),
}

/// A malformed option payload: answered with `NBD_REP_ERR_INVALID`, the handshake goes on.
#[derive(thiserror::Error, Debug, PartialEq, Eq)]
pub enum OptParseError {
    #[error("option data is truncated")]
    Truncated,
    #[error("option data has {0} trailing bytes")]
    Trailing(usize),
    #[error("string is longer than {MAX_STRING} bytes")]
    StringTooLong,
    #[error("string is not valid UTF-8 or contains NUL")]
    BadString,
}

/// One transmission request header.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RequestHeader {
    pub flags: u16,
    pub typ: u16,
    pub handle: u64,
    pub offset: u64,
    pub len: u32,
}

impl RequestHeader {
    /// Decodes the 28-byte header; only the magic can be wrong at this level.
    pub fn decode(b: &[u8; REQUEST_HEADER_LEN]) -> Result<Self, HeaderError> {
        let magic = be_u32(&b[0..4]);
        if magic != REQUEST_MAGIC {
            return Err(HeaderError::RequestMagic(magic));
        }
        Ok(Self {
            flags: be_u16(&b[4..6]),
            typ: be_u16(&b[6..8]),
            handle: be_u64(&b[8..16]),
            offset: be_u64(&b[16..24]),
            len: be_u32(&b[24..28]),
        })
    }

    /// Encodes the header (what a client sends; used by tests).
    pub fn encode(&self) -> [u8; REQUEST_HEADER_LEN] {
        let mut b = [0u8; REQUEST_HEADER_LEN];
        b[0..4].copy_from_slice(&REQUEST_MAGIC.to_be_bytes());
        b[4..6].copy_from_slice(&self.flags.to_be_bytes());
        b[6..8].copy_from_slice(&self.typ.to_be_bytes());
        b[8..16].copy_from_slice(&self.handle.to_be_bytes());
        b[16..24].copy_from_slice(&self.offset.to_be_bytes());
        b[24..28].copy_from_slice(&self.len.to_be_bytes());
        b
    }
}

/// One option header: `IHAVEOPT`, the option number and the length of its data.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct OptionHeader {
    pub option: u32,
    pub len: u32,
}

impl OptionHeader {
    pub fn decode(b: &[u8; OPTION_HEADER_LEN]) -> Result<Self, HeaderError> {
        let magic = be_u64(&b[0..8]);
        if magic != IHAVEOPT {
            return Err(HeaderError::OptionMagic(magic));
        }
        Ok(Self {
            option: be_u32(&b[8..12]),
            len: be_u32(&b[12..16]),
        })
    }

    pub fn encode(&self) -> [u8; OPTION_HEADER_LEN] {
        let mut b = [0u8; OPTION_HEADER_LEN];
        b[0..8].copy_from_slice(&IHAVEOPT.to_be_bytes());
        b[8..12].copy_from_slice(&self.option.to_be_bytes());
        b[12..16].copy_from_slice(&self.len.to_be_bytes());
        b
    }
}

/// The server's greeting: `NBDMAGIC`, `IHAVEOPT`, handshake flags.
pub fn greeting() -> [u8; 18] {
    let mut b = [0u8; 18];
    b[0..8].copy_from_slice(&NBD_MAGIC.to_be_bytes());
    b[8..16].copy_from_slice(&IHAVEOPT.to_be_bytes());
    b[16..18].copy_from_slice(&(FLAG_FIXED_NEWSTYLE | FLAG_NO_ZEROES).to_be_bytes());
    b
}

/// An option reply: magic, option, reply type, length, data.
pub fn option_reply(option: u32, reply_type: u32, data: &[u8]) -> Vec<u8> {
    let mut v = Vec::with_capacity(20 + data.len());
    v.extend_from_slice(&OPTION_REPLY_MAGIC.to_be_bytes());
    v.extend_from_slice(&option.to_be_bytes());
    v.extend_from_slice(&reply_type.to_be_bytes());
    v.extend_from_slice(&len_u32(data.len()).to_be_bytes());
    v.extend_from_slice(data);
    v
}

/// The reply to `NBD_OPT_EXPORT_NAME`: size, transmission flags, and 124 zeros unless the
/// client negotiated `NBD_FLAG_C_NO_ZEROES`.
pub fn export_name_reply(size: u64, flags: u16, no_zeroes: bool) -> Vec<u8> {
    let mut v = Vec::with_capacity(134);
    v.extend_from_slice(&size.to_be_bytes());
    v.extend_from_slice(&flags.to_be_bytes());
    if !no_zeroes {
        v.extend_from_slice(&[0u8; 124]);
    }
    v
}

/// `NBD_REP_INFO` payload for `NBD_INFO_EXPORT`.
pub fn info_export(size: u64, flags: u16) -> Vec<u8> {
    let mut v = Vec::with_capacity(12);
    v.extend_from_slice(&info::EXPORT.to_be_bytes());
    v.extend_from_slice(&size.to_be_bytes());
    v.extend_from_slice(&flags.to_be_bytes());
    v
}

/// `NBD_REP_INFO` payload for `NBD_INFO_NAME` or `NBD_INFO_DESCRIPTION`.
pub fn info_string(kind: u16, s: &str) -> Vec<u8> {
    let s = truncate_str(s, MAX_STRING);
    let mut v = Vec::with_capacity(2 + s.len());
    v.extend_from_slice(&kind.to_be_bytes());
    v.extend_from_slice(s.as_bytes());
    v
}

/// `NBD_REP_INFO` payload for `NBD_INFO_BLOCK_SIZE`.
pub fn info_block_size(min: u32, preferred: u32, max: u32) -> Vec<u8> {
    let mut v = Vec::with_capacity(14);
    v.extend_from_slice(&info::BLOCK_SIZE.to_be_bytes());
    v.extend_from_slice(&min.to_be_bytes());
    v.extend_from_slice(&preferred.to_be_bytes());
    v.extend_from_slice(&max.to_be_bytes());
    v
}

/// `NBD_REP_SERVER` payload: name length, name, description.
pub fn server_entry(name: &str, description: &str) -> Vec<u8> {
    let name = truncate_str(name, MAX_STRING);
    let description = truncate_str(description, MAX_STRING);
    let mut v = Vec::with_capacity(4 + name.len() + description.len());
    v.extend_from_slice(&len_u32(name.len()).to_be_bytes());
    v.extend_from_slice(name.as_bytes());
    v.extend_from_slice(description.as_bytes());
    v
}

/// `NBD_REP_META_CONTEXT` payload: context id, name.
pub fn meta_context_entry(id: u32, name: &str) -> Vec<u8> {
    let mut v = Vec::with_capacity(4 + name.len());
    v.extend_from_slice(&id.to_be_bytes());
    v.extend_from_slice(name.as_bytes());
    v
}

/// A simple reply header (magic, error, handle); read data follows it on success.
pub fn simple_reply(error: u32, handle: u64) -> [u8; 16] {
    let mut b = [0u8; 16];
    b[0..4].copy_from_slice(&SIMPLE_REPLY_MAGIC.to_be_bytes());
    b[4..8].copy_from_slice(&error.to_be_bytes());
    b[8..16].copy_from_slice(&handle.to_be_bytes());
    b
}

/// A structured reply chunk header (magic, flags, type, handle, payload length).
pub fn chunk_header(flags: u16, typ: u16, handle: u64, len: u32) -> [u8; 20] {
    let mut b = [0u8; 20];
    b[0..4].copy_from_slice(&STRUCTURED_REPLY_MAGIC.to_be_bytes());
    b[4..6].copy_from_slice(&flags.to_be_bytes());
    b[6..8].copy_from_slice(&typ.to_be_bytes());
    b[8..16].copy_from_slice(&handle.to_be_bytes());
    b[16..20].copy_from_slice(&len.to_be_bytes());
    b
}

/// Payload of `NBD_REPLY_TYPE_ERROR`: error, message length, message (cut to fit).
pub fn error_payload(error: u32, message: &str) -> Vec<u8> {
    let message = truncate_str(message, MAX_STRING);
    let mut v = Vec::with_capacity(6 + message.len());
    v.extend_from_slice(&error.to_be_bytes());
    let mlen = u16::try_from(message.len()).expect("message cut to MAX_STRING fits in u16");
    v.extend_from_slice(&mlen.to_be_bytes());
    v.extend_from_slice(message.as_bytes());
    v
}

/// Payload of `NBD_REPLY_TYPE_OFFSET_HOLE`.
pub fn hole_payload(offset: u64, len: u32) -> [u8; 12] {
    let mut b = [0u8; 12];
    b[0..8].copy_from_slice(&offset.to_be_bytes());
    b[8..12].copy_from_slice(&len.to_be_bytes());
    b
}

/// Payload of `NBD_REPLY_TYPE_BLOCK_STATUS`: context id, then (length, flags) descriptors.
pub fn block_status_payload(context_id: u32, descriptors: &[(u32, u32)]) -> Vec<u8> {
    let mut v = Vec::with_capacity(4 + 8 * descriptors.len());
    v.extend_from_slice(&context_id.to_be_bytes());
    for (len, flags) in descriptors {
        v.extend_from_slice(&len.to_be_bytes());
        v.extend_from_slice(&flags.to_be_bytes());
    }
    v
}

/// `NBD_OPT_INFO` / `NBD_OPT_GO` data.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct InfoRequest {
    pub name: String,
    pub requests: Vec<u16>,
}

/// Parses `NBD_OPT_INFO`/`NBD_OPT_GO` data: name length, name, count, `count` info types.
pub fn parse_info_request(data: &[u8]) -> Result<InfoRequest, OptParseError> {
    let mut r = Reader::new(data);
    let name_len = r.u32()?;
    let name = r.string(name_len)?;
    let count = r.u16()?;
    let mut requests = Vec::with_capacity(usize::from(count).min(r.remaining() / 2));
    for _ in 0..count {
        requests.push(r.u16()?);
    }
    r.finish()?;
    Ok(InfoRequest { name, requests })
}

/// Parses `NBD_OPT_EXPORT_NAME` data: the whole payload is the name.
pub fn parse_export_name(data: &[u8]) -> Result<String, OptParseError> {
    let len = u32::try_from(data.len()).map_err(|_| OptParseError::StringTooLong)?;
    let mut r = Reader::new(data);
    let name = r.string(len)?;
    r.finish()?;
    Ok(name)
}

/// `NBD_OPT_LIST_META_CONTEXT` / `NBD_OPT_SET_META_CONTEXT` data.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct MetaContextRequest {
    pub export: String,
    pub queries: Vec<String>,
}

/// Parses meta-context option data: export name length, name, query count, then each query
/// as length + string.
pub fn parse_meta_context_request(data: &[u8]) -> Result<MetaContextRequest, OptParseError> {
    let mut r = Reader::new(data);
    let name_len = r.u32()?;
    let export = r.string(name_len)?;
    let count = r.u32()?;
    // Each query needs at least its 4-byte length, so the count is bounded by the data.
    if usize::try_from(count).map_or(true, |c| c > r.remaining() / 4) {
        return Err(OptParseError::Truncated);
    }
    let mut queries = Vec::with_capacity(count as usize);
    for _ in 0..count {
        let qlen = r.u32()?;
        queries.push(r.string(qlen)?);
    }
    r.finish()?;
    Ok(MetaContextRequest { export, queries })
}

/// Which contexts a query selects, for the only context this server has. `None` = the query
/// is syntactically invalid (no namespace).
pub fn query_selects_base_allocation(query: &str) -> Option<bool> {
    let (namespace, rest) = query.split_once(':')?;
    if namespace.is_empty() {
        return None;
    }
    Some(namespace == "base" && (rest.is_empty() || rest == "allocation"))
}

struct Reader<'a> {
    data: &'a [u8],
    pos: usize,
}

impl<'a> Reader<'a> {
    fn new(data: &'a [u8]) -> Self {
        Self { data, pos: 0 }
    }
    fn remaining(&self) -> usize {
        self.data.len() - self.pos
    }
    fn take(&mut self, n: usize) -> Result<&'a [u8], OptParseError> {
        if n > self.remaining() {
            return Err(OptParseError::Truncated);
        }
        let s = &self.data[self.pos..self.pos + n];
        self.pos += n;
        Ok(s)
    }
    fn u16(&mut self) -> Result<u16, OptParseError> {
        Ok(be_u16(self.take(2)?))
    }
    fn u32(&mut self) -> Result<u32, OptParseError> {
        Ok(be_u32(self.take(4)?))
    }
    fn string(&mut self, len: u32) -> Result<String, OptParseError> {
        let len = usize::try_from(len).map_err(|_| OptParseError::StringTooLong)?;
        if len > MAX_STRING {
            // Distinguish "too long" from "truncated" only when the bytes are really there.
            return Err(if len > self.remaining() {
                OptParseError::Truncated
            } else {
                OptParseError::StringTooLong
            });
        }
        let bytes = self.take(len)?;
        let s = std::str::from_utf8(bytes).map_err(|_| OptParseError::BadString)?;
        if s.contains('\0') {
            return Err(OptParseError::BadString);
        }
        Ok(s.to_owned())
    }
    fn finish(&self) -> Result<(), OptParseError> {
        match self.remaining() {
            0 => Ok(()),
            n => Err(OptParseError::Trailing(n)),
        }
    }
}

fn be_u16(b: &[u8]) -> u16 {
    u16::from_be_bytes(b.try_into().expect("caller passes exactly 2 bytes"))
}
fn be_u32(b: &[u8]) -> u32 {
    u32::from_be_bytes(b.try_into().expect("caller passes exactly 4 bytes"))
}
fn be_u64(b: &[u8]) -> u64 {
    u64::from_be_bytes(b.try_into().expect("caller passes exactly 8 bytes"))
}

fn len_u32(n: usize) -> u32 {
    u32::try_from(n).expect("option replies are built from bounded strings")
}

/// Cuts `s` to at most `max` bytes on a character boundary.
pub fn truncate_str(s: &str, max: usize) -> &str {
    if s.len() <= max {
        return s;
    }
    let mut end = max;
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    &s[..end]
}

/// Printable name of a command, for logs.
pub struct CmdName(pub u16);

impl fmt::Display for CmdName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let name = match self.0 {
            cmd::READ => "READ",
            cmd::WRITE => "WRITE",
            cmd::DISC => "DISC",
            cmd::FLUSH => "FLUSH",
            cmd::TRIM => "TRIM",
            cmd::CACHE => "CACHE",
            cmd::WRITE_ZEROES => "WRITE_ZEROES",
            cmd::BLOCK_STATUS => "BLOCK_STATUS",
            other => return write!(f, "command {other}"),
        };
        f.write_str(name)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn request_header_round_trips_and_matches_the_spec_layout() {
        let h = RequestHeader {
            flags: cmd_flag::FUA,
            typ: cmd::WRITE,
            handle: 0x0102_0304_0506_0708,
            offset: 0x1000,
            len: 512,
        };
        let b = h.encode();
        assert_eq!(&b[0..4], &[0x25, 0x60, 0x95, 0x13]);
        assert_eq!(&b[4..6], &[0, 1]);
        assert_eq!(&b[6..8], &[0, 1]);
        assert_eq!(&b[8..16], &[1, 2, 3, 4, 5, 6, 7, 8]);
        assert_eq!(&b[24..28], &[0, 0, 2, 0]);
        assert_eq!(RequestHeader::decode(&b), Ok(h));
        let mut bad = b;
        bad[0] = 0;
        assert_eq!(
            RequestHeader::decode(&bad),
            Err(HeaderError::RequestMagic(0x0060_9513))
        );
    }

    #[test]
    fn option_header_and_greeting() {
        let g = greeting();
        assert_eq!(&g[0..8], b"NBDMAGIC");
        assert_eq!(&g[8..16], b"IHAVEOPT");
        assert_eq!(&g[16..18], &[0, 3]);
        let h = OptionHeader {
            option: opt::GO,
            len: 7,
        };
        let b = h.encode();
        assert_eq!(&b[0..8], b"IHAVEOPT");
        assert_eq!(OptionHeader::decode(&b), Ok(h));
        let mut bad = b;
        bad[7] = b'X';
        assert!(matches!(
            OptionHeader::decode(&bad),
            Err(HeaderError::OptionMagic(_))
        ));
    }

    #[test]
    fn option_reply_layout() {
        let r = option_reply(opt::LIST, rep::ERR_UNSUP, b"hi");
        assert_eq!(&r[0..8], &[0, 3, 0xe8, 0x89, 0x04, 0x55, 0x65, 0xa9]);
        assert_eq!(&r[8..12], &[0, 0, 0, 3]);
        assert_eq!(&r[12..16], &[0x80, 0, 0, 1]);
        assert_eq!(&r[16..20], &[0, 0, 0, 2]);
        assert_eq!(&r[20..], b"hi");
    }

    #[test]
    fn export_name_reply_honours_no_zeroes() {
        assert_eq!(export_name_reply(1 << 20, 0x0d, false).len(), 8 + 2 + 124);
        let r = export_name_reply(1 << 20, 0x0d, true);
        assert_eq!(r, [0, 0, 0, 0, 0, 0x10, 0, 0, 0, 0x0d]);
    }

    #[test]
    fn info_payloads() {
        assert_eq!(info_export(5, 1), [0, 0, 0, 0, 0, 0, 0, 0, 0, 5, 0, 1]);
        assert_eq!(
            info_block_size(1, 4096, 1 << 25),
            [0, 3, 0, 0, 0, 1, 0, 0, 0x10, 0, 2, 0, 0, 0]
        );
        assert_eq!(info_string(info::NAME, "ab"), [0, 1, b'a', b'b']);
        assert_eq!(server_entry("x", "d"), [0, 0, 0, 1, b'x', b'd']);
        assert_eq!(meta_context_entry(1, "b"), [0, 0, 0, 1, b'b']);
    }

    #[test]
    fn reply_layouts() {
        let s = simple_reply(22, 9);
        assert_eq!(&s[0..4], &[0x67, 0x44, 0x66, 0x98]);
        assert_eq!(&s[4..8], &[0, 0, 0, 22]);
        assert_eq!(&s[8..16], &9u64.to_be_bytes());
        let c = chunk_header(reply::FLAG_DONE, reply::TYPE_ERROR, 7, 6);
        assert_eq!(&c[0..4], &[0x66, 0x8e, 0x33, 0xef]);
        assert_eq!(&c[4..8], &[0, 1, 0x80, 1]);
        assert_eq!(&c[16..20], &[0, 0, 0, 6]);
        assert_eq!(error_payload(5, ""), [0, 0, 0, 5, 0, 0]);
        let long = "é".repeat(3000);
        let p = error_payload(5, &long);
        let mlen = usize::from(u16::from_be_bytes([p[4], p[5]]));
        assert!(mlen <= MAX_STRING);
        assert!(std::str::from_utf8(&p[6..]).is_ok());
        assert_eq!(p.len(), 6 + mlen);
        assert_eq!(
            block_status_payload(1, &[(512, STATE_HOLE | STATE_ZERO)]),
            [0, 0, 0, 1, 0, 0, 2, 0, 0, 0, 0, 3]
        );
        assert_eq!(hole_payload(1, 2), [0, 0, 0, 0, 0, 0, 0, 1, 0, 0, 0, 2]);
    }

    fn info_data(name: &[u8], reqs: &[u16]) -> Vec<u8> {
        let mut v = (name.len() as u32).to_be_bytes().to_vec();
        v.extend_from_slice(name);
        v.extend_from_slice(&(reqs.len() as u16).to_be_bytes());
        for r in reqs {
            v.extend_from_slice(&r.to_be_bytes());
        }
        v
    }

    #[test]
    fn info_request_parsing() {
        let d = info_data(b"disk", &[info::NAME, info::BLOCK_SIZE]);
        assert_eq!(
            parse_info_request(&d),
            Ok(InfoRequest {
                name: "disk".into(),
                requests: vec![1, 3]
            })
        );
        assert_eq!(
            parse_info_request(&d[..d.len() - 1]),
            Err(OptParseError::Truncated)
        );
        let mut extra = d.clone();
        extra.push(0);
        assert_eq!(parse_info_request(&extra), Err(OptParseError::Trailing(1)));
        assert_eq!(parse_info_request(&[]), Err(OptParseError::Truncated));
        // A name length pointing past the end, a huge count, bad UTF-8, NUL.
        assert_eq!(
            parse_info_request(&[0xff, 0xff, 0xff, 0xff, 0]),
            Err(OptParseError::Truncated)
        );
        let mut huge_count = info_data(b"", &[]);
        huge_count[4] = 0xff;
        assert_eq!(
            parse_info_request(&huge_count),
            Err(OptParseError::Truncated)
        );
        assert_eq!(
            parse_info_request(&info_data(&[0xff], &[])),
            Err(OptParseError::BadString)
        );
        assert_eq!(
            parse_info_request(&info_data(b"a\0", &[])),
            Err(OptParseError::BadString)
        );
        let long = vec![b'a'; MAX_STRING + 1];
        assert_eq!(
            parse_info_request(&info_data(&long, &[])),
            Err(OptParseError::StringTooLong)
        );
    }

    #[test]
    fn meta_context_parsing() {
        let mut d = 4u32.to_be_bytes().to_vec();
        d.extend_from_slice(b"disk");
        d.extend_from_slice(&2u32.to_be_bytes());
        for q in ["base:allocation", "qemu:dirty-bitmap:x"] {
            d.extend_from_slice(&(q.len() as u32).to_be_bytes());
            d.extend_from_slice(q.as_bytes());
        }
        let m = parse_meta_context_request(&d).unwrap();
        assert_eq!(m.export, "disk");
        assert_eq!(m.queries, vec!["base:allocation", "qemu:dirty-bitmap:x"]);
        for cut in 0..d.len() {
            assert!(
                parse_meta_context_request(&d[..cut]).is_err(),
                "cut at {cut}"
            );
        }
        // A count far larger than the data can hold is rejected before allocating.
        let mut big = 0u32.to_be_bytes().to_vec();
        big.extend_from_slice(&u32::MAX.to_be_bytes());
        assert_eq!(
            parse_meta_context_request(&big),
            Err(OptParseError::Truncated)
        );
    }

    #[test]
    fn queries() {
        assert_eq!(query_selects_base_allocation("base:allocation"), Some(true));
        assert_eq!(query_selects_base_allocation("base:"), Some(true));
        assert_eq!(query_selects_base_allocation("base:other"), Some(false));
        assert_eq!(
            query_selects_base_allocation("qemu:dirty-bitmap:a"),
            Some(false)
        );
        assert_eq!(query_selects_base_allocation("nocolon"), None);
        assert_eq!(query_selects_base_allocation(":x"), None);
    }

    #[test]
    fn export_name_parsing() {
        assert_eq!(parse_export_name(b""), Ok(String::new()));
        assert_eq!(parse_export_name(b"disk"), Ok("disk".into()));
        assert_eq!(parse_export_name(&[0xc3]), Err(OptParseError::BadString));
    }

    proptest::proptest! {
        #[test]
        fn option_parsers_never_panic(data in proptest::collection::vec(proptest::num::u8::ANY, 0..300)) {
            let _ = parse_info_request(&data);
            let _ = parse_meta_context_request(&data);
            let _ = parse_export_name(&data);
        }

        #[test]
        fn request_headers_decode_any_bytes(data in proptest::array::uniform28(proptest::num::u8::ANY)) {
            if let Ok(h) = RequestHeader::decode(&data) {
                proptest::prop_assert_eq!(h.encode(), data);
            }
        }
    }
}
