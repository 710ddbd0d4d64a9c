//! Compound operations: several steps on one object applied atomically, guards first.
//!
//! ```no_run
//! # async fn demo(io: &kelp_client::IoCtx) -> Result<(), kelp_client::ClientError> {
//! use kelp_client::WriteOp;
//! // compare-and-swap: only if the "owner" xattr is still "alice"
//! let op = WriteOp::new()
//!     .cmp_xattr("owner", &b"alice"[..])
//!     .set_xattr("owner", &b"bob"[..])
//!     .write_full(&b"bob's now"[..]);
//! io.operate(op, "lock-object").await?;
//! # Ok(()) }
//! ```

use bytes::{Bytes, BytesMut};
use kelp_proto::{CmpOp, OpKind, OpResult};

use crate::ClientError;

/// A write made of steps; data of all steps travels in one buffer.
#[derive(Debug, Default, Clone)]
pub struct WriteOp {
    pub(crate) ops: Vec<OpKind>,
    pub(crate) data: BytesMut,
}

impl WriteOp {
    pub fn new() -> Self {
        Self::default()
    }

    fn with(mut self, op: OpKind, data: &[u8]) -> Self {
        self.ops.push(op);
        self.data.extend_from_slice(data);
        self
    }

    /// Fails the whole op with `NotFound` unless the object exists.
    pub fn assert_exists(self) -> Self {
        self.with(OpKind::AssertExists, &[])
    }
    /// Fails with `Canceled` unless the object's version is `version` (0 = does not exist).
    pub fn assert_version(self, version: u64) -> Self {
        self.with(OpKind::AssertVersion { version }, &[])
    }
    /// Fails with `Canceled` unless xattr `name` equals `value`.
    pub fn cmp_xattr(self, name: &str, value: impl AsRef<[u8]>) -> Self {
        let v = value.as_ref();
        self.with(
            OpKind::CmpXattr {
                name: name.into(),
                op: CmpOp::Eq,
                len: v.len() as u64,
            },
            v,
        )
    }
    /// Fails with `Canceled` unless omap key `key` holds exactly `value`, or, with `None`,
    /// unless the key is absent.
    pub fn cmp_omap(self, key: &str, value: Option<&[u8]>) -> Self {
        self.with(
            OpKind::CmpOmap {
                key: key.into(),
                op: CmpOp::Eq,
                len: value.map(|v| v.len() as u64),
            },
            value.unwrap_or_default(),
        )
    }
    /// Fails with `Canceled` unless omap key `key` is present (any value).
    pub fn omap_key_present(self, key: &str) -> Self {
        self.with(
            OpKind::CmpOmap {
                key: key.into(),
                op: CmpOp::Ne,
                len: None,
            },
            &[],
        )
    }
    /// Creates the object; with `exclusive`, fails with `Exists` if it exists.
    pub fn create(self, exclusive: bool) -> Self {
        self.with(OpKind::Create { exclusive }, &[])
    }
    pub fn write_full(self, data: impl AsRef<[u8]>) -> Self {
        let d = data.as_ref();
        self.with(
            OpKind::WriteFull {
                len: d.len() as u64,
            },
            d,
        )
    }
    pub fn write(self, offset: u64, data: impl AsRef<[u8]>) -> Self {
        let d = data.as_ref();
        self.with(
            OpKind::Write {
                offset,
                len: d.len() as u64,
            },
            d,
        )
    }
    pub fn append(self, data: impl AsRef<[u8]>) -> Self {
        let d = data.as_ref();
        self.with(
            OpKind::Append {
                len: d.len() as u64,
            },
            d,
        )
    }
    pub fn truncate(self, size: u64) -> Self {
        self.with(OpKind::Truncate { size }, &[])
    }
    pub fn zero(self, offset: u64, len: u64) -> Self {
        self.with(OpKind::Zero { offset, len }, &[])
    }
    pub fn remove(self) -> Self {
        self.with(OpKind::Remove, &[])
    }
    pub fn set_xattr(self, name: &str, value: impl AsRef<[u8]>) -> Self {
        let v = value.as_ref();
        self.with(
            OpKind::SetXattr {
                name: name.into(),
                len: v.len() as u64,
            },
            v,
        )
    }
    pub fn rm_xattr(self, name: &str) -> Self {
        self.with(OpKind::RmXattr { name: name.into() }, &[])
    }
    /// Sets omap entries.
    pub fn omap_set<K: AsRef<str>, V: AsRef<[u8]>>(mut self, entries: &[(K, V)]) -> Self {
        let mut list = Vec::with_capacity(entries.len());
        for (k, v) in entries {
            list.push((k.as_ref().to_string(), v.as_ref().len() as u64));
            self.data.extend_from_slice(v.as_ref());
        }
        self.ops.push(OpKind::OmapSet { entries: list });
        self
    }
    pub fn omap_rm_keys<K: AsRef<str>>(self, keys: &[K]) -> Self {
        let keys = keys.iter().map(|k| k.as_ref().to_string()).collect();
        self.with(OpKind::OmapRm { keys }, &[])
    }
    pub fn omap_clear(self) -> Self {
        self.with(OpKind::OmapClear, &[])
    }
    pub fn omap_set_header(self, header: impl AsRef<[u8]>) -> Self {
        let h = header.as_ref();
        self.with(
            OpKind::OmapSetHeader {
                len: h.len() as u64,
            },
            h,
        )
    }
}

/// A read made of steps (guards allowed).
#[derive(Debug, Default, Clone)]
pub struct ReadOp {
    pub(crate) ops: Vec<OpKind>,
    pub(crate) data: BytesMut,
}

impl ReadOp {
    pub fn new() -> Self {
        Self::default()
    }
    fn with(mut self, op: OpKind, data: &[u8]) -> Self {
        self.ops.push(op);
        self.data.extend_from_slice(data);
        self
    }
    pub fn assert_version(self, version: u64) -> Self {
        self.with(OpKind::AssertVersion { version }, &[])
    }
    pub fn cmp_xattr(self, name: &str, value: impl AsRef<[u8]>) -> Self {
        let v = value.as_ref();
        self.with(
            OpKind::CmpXattr {
                name: name.into(),
                op: CmpOp::Eq,
                len: v.len() as u64,
            },
            v,
        )
    }
    /// `len == 0` reads to the end.
    pub fn read(self, offset: u64, len: u64) -> Self {
        self.with(OpKind::Read { offset, len }, &[])
    }
    pub fn stat(self) -> Self {
        self.with(OpKind::Stat, &[])
    }
    pub fn get_xattr(self, name: &str) -> Self {
        self.with(OpKind::GetXattr { name: name.into() }, &[])
    }
    pub fn get_xattrs(self) -> Self {
        self.with(OpKind::GetXattrs, &[])
    }
    pub fn omap_get_vals(self, start_after: &str, prefix: &str, max: u32) -> Self {
        self.with(
            OpKind::OmapGetVals {
                start_after: start_after.into(),
                prefix: prefix.into(),
                max,
            },
            &[],
        )
    }
    pub fn omap_get_vals_by_keys<K: AsRef<str>>(self, keys: &[K]) -> Self {
        let keys = keys.iter().map(|k| k.as_ref().to_string()).collect();
        self.with(OpKind::OmapGetValsByKeys { keys }, &[])
    }
    pub fn omap_get_header(self) -> Self {
        self.with(OpKind::OmapGetHeader, &[])
    }
}

/// Per-step results of a read, with their data split out.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ReadResult {
    /// Guards produce no output.
    None,
    Data(Bytes),
    Stat {
        size: u64,
        mtime_ns: u64,
        version: u64,
    },
    /// Name → value (xattrs) or key → value (omap), in order.
    Pairs {
        entries: Vec<(String, Bytes)>,
        more: bool,
    },
}

/// Splits a reply's data segment among its results. A reply whose results promise more data
/// than it carries is refused as [`ClientError::Invalid`].
pub(crate) fn split_results(
    outs: Vec<OpResult>,
    mut data: Bytes,
) -> Result<Vec<ReadResult>, ClientError> {
    let mut take = |len: u64| -> Result<Bytes, ClientError> {
        if len > data.len() as u64 {
            return Err(ClientError::Invalid(format!(
                "reply promises {len} bytes but only {} remain",
                data.len()
            )));
        }
        Ok(data.split_to(len as usize))
    };
    let mut results = Vec::with_capacity(outs.len());
    for out in outs {
        results.push(match out {
            OpResult::None => ReadResult::None,
            OpResult::Data { len } => ReadResult::Data(take(len)?),
            OpResult::Stat {
                size,
                mtime_ns,
                version,
            } => ReadResult::Stat {
                size,
                mtime_ns,
                version,
            },
            OpResult::Xattrs { entries } => ReadResult::Pairs {
                entries: entries
                    .into_iter()
                    .map(|(k, len)| take(len).map(|v| (k, v)))
                    .collect::<Result<_, _>>()?,
                more: false,
            },
            OpResult::Omap { entries, more } => ReadResult::Pairs {
                entries: entries
                    .into_iter()
                    .map(|(k, len)| take(len).map(|v| (k, v)))
                    .collect::<Result<_, _>>()?,
                more,
            },
        });
    }
    Ok(results)
}
