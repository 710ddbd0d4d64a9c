//! A sparse in-memory device and a catalogue of them, for tests and demonstrations.
//!
//! The device is thin: data lives in 64 KiB chunks in a `BTreeMap`, an absent chunk is a hole
//! that reads as zeros, trim and write-zeroes (without `no_hole`) free the chunks they cover
//! whole and zero the parts of others (freeing a chunk that becomes all zeros), and block status
//! reports absent chunks as holes. Memory is the only storage, shared by every connection, so
//! flush has nothing to do and multi-conn is safe.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, RwLock};

use async_trait::async_trait;
use bytes::{Bytes, BytesMut};

use crate::device::{BlockDevice, DeviceError, ExportInfo, Exports, Extent, OpenError};

/// Chunk size of [`MemDevice`].
pub const CHUNK: u64 = 64 << 10;

/// Counters a test can check to see that flags reached the device.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct MemStats {
    pub writes: u64,
    pub fua_writes: u64,
    pub flushes: u64,
    pub trims: u64,
    pub zero_writes: u64,
    pub no_hole_zero_writes: u64,
}

#[derive(Default)]
struct Counters {
    writes: AtomicU64,
    fua_writes: AtomicU64,
    flushes: AtomicU64,
    trims: AtomicU64,
    zero_writes: AtomicU64,
    no_hole_zero_writes: AtomicU64,
}

/// Sparse in-memory block device.
pub struct MemDevice {
    info: ExportInfo,
    chunks: RwLock<BTreeMap<u64, Box<[u8]>>>,
    counters: Counters,
}

impl MemDevice {
    /// A writable device of `size` bytes with trim, block status and multi-conn, block sizes
    /// 1 / 4 KiB / 32 MiB.
    pub fn new(size: u64) -> Self {
        Self::with_info(ExportInfo {
            size,
            read_only: false,
            can_trim: true,
            block_status: true,
            multi_conn: true,
            min_block: 1,
            preferred_block: 4096,
            max_block: 32 << 20,
            description: "in-memory device".to_owned(),
        })
    }

    /// A device described by `info` (its size included).
    pub fn with_info(info: ExportInfo) -> Self {
        Self {
            info,
            chunks: RwLock::new(BTreeMap::new()),
            counters: Counters::default(),
        }
    }

    /// Bytes held in memory (allocated chunks).
    pub fn allocated_bytes(&self) -> u64 {
        let chunks = self
            .chunks
            .read()
            .expect("no code panics while holding the lock");
        chunks.values().map(|c| c.len() as u64).sum()
    }

    /// What the device has been asked to do so far.
    pub fn stats(&self) -> MemStats {
        let c = &self.counters;
        MemStats {
            writes: c.writes.load(Ordering::Relaxed),
            fua_writes: c.fua_writes.load(Ordering::Relaxed),
            flushes: c.flushes.load(Ordering::Relaxed),
            trims: c.trims.load(Ordering::Relaxed),
            zero_writes: c.zero_writes.load(Ordering::Relaxed),
            no_hole_zero_writes: c.no_hole_zero_writes.load(Ordering::Relaxed),
        }
    }

    /// Copies `[offset, offset+len)` out without going through the protocol (for tests).
    pub fn read_now(&self, offset: u64, len: usize) -> Result<Vec<u8>, DeviceError> {
        self.check(offset, len as u64)?;
        let mut out = vec![0u8; len];
        let chunks = self
            .chunks
            .read()
            .expect("no code panics while holding the lock");
        for (idx, start, end) in self.pieces(offset, len as u64) {
            if let Some(c) = chunks.get(&idx) {
                let at = (idx * CHUNK + start - offset) as usize;
                out[at..at + (end - start) as usize]
                    .copy_from_slice(&c[start as usize..end as usize]);
            }
        }
        Ok(out)
    }

    fn chunk_len(&self, idx: u64) -> usize {
        (self.info.size - idx * CHUNK).min(CHUNK) as usize
    }

    fn check(&self, offset: u64, len: u64) -> Result<(), DeviceError> {
        match offset.checked_add(len) {
            Some(end) if end <= self.info.size => Ok(()),
            _ => Err(DeviceError::Invalid(format!(
                "range {offset}+{len} past the end ({})",
                self.info.size
            ))),
        }
    }

    /// The chunk-relative pieces of a range: (chunk index, start, end) within each chunk.
    fn pieces(&self, offset: u64, len: u64) -> impl Iterator<Item = (u64, u64, u64)> {
        let end = offset + len;
        let first = offset / CHUNK;
        let last = if len == 0 {
            first
        } else {
            (end - 1) / CHUNK + 1
        };
        (first..last).map(move |idx| {
            let base = idx * CHUNK;
            (idx, offset.max(base) - base, end.min(base + CHUNK) - base)
        })
    }

    fn zero_range(&self, offset: u64, len: u64, keep_allocated: bool) {
        let mut chunks = self
            .chunks
            .write()
            .expect("no code panics while holding the lock");
        for (idx, start, end) in self.pieces(offset, len) {
            let whole = start == 0 && end as usize == self.chunk_len(idx);
            if keep_allocated {
                let c = chunks
                    .entry(idx)
                    .or_insert_with(|| vec![0u8; self.chunk_len(idx)].into_boxed_slice());
                c[start as usize..end as usize].fill(0);
            } else if whole {
                chunks.remove(&idx);
            } else if let Some(c) = chunks.get_mut(&idx) {
                c[start as usize..end as usize].fill(0);
                if c.iter().all(|b| *b == 0) {
                    chunks.remove(&idx);
                }
            }
        }
    }
}

#[async_trait]
impl BlockDevice for MemDevice {
    fn info(&self) -> ExportInfo {
        self.info.clone()
    }

    async fn read(&self, offset: u64, len: u32) -> Result<Bytes, DeviceError> {
        self.check(offset, u64::from(len))?;
        let mut out = BytesMut::zeroed(len as usize);
        let chunks = self
            .chunks
            .read()
            .expect("no code panics while holding the lock");
        for (idx, start, end) in self.pieces(offset, u64::from(len)) {
            if let Some(c) = chunks.get(&idx) {
                let at = (idx * CHUNK + start - offset) as usize;
                out[at..at + (end - start) as usize]
                    .copy_from_slice(&c[start as usize..end as usize]);
            }
        }
        Ok(out.freeze())
    }

    async fn write(&self, offset: u64, data: Bytes, fua: bool) -> Result<(), DeviceError> {
        if self.info.read_only {
            return Err(DeviceError::ReadOnly);
        }
        self.check(offset, data.len() as u64)?;
        let mut chunks = self
            .chunks
            .write()
            .expect("no code panics while holding the lock");
        for (idx, start, end) in self.pieces(offset, data.len() as u64) {
            let c = chunks
                .entry(idx)
                .or_insert_with(|| vec![0u8; self.chunk_len(idx)].into_boxed_slice());
            let at = (idx * CHUNK + start - offset) as usize;
            c[start as usize..end as usize].copy_from_slice(&data[at..at + (end - start) as usize]);
        }
        self.counters.writes.fetch_add(1, Ordering::Relaxed);
        if fua {
            self.counters.fua_writes.fetch_add(1, Ordering::Relaxed);
        }
        Ok(())
    }

    async fn flush(&self) -> Result<(), DeviceError> {
        // Memory shared by all connections: every completed write is already visible to all.
        self.counters.flushes.fetch_add(1, Ordering::Relaxed);
        Ok(())
    }

    async fn trim(&self, offset: u64, len: u32) -> Result<(), DeviceError> {
        if self.info.read_only {
            return Err(DeviceError::ReadOnly);
        }
        self.check(offset, u64::from(len))?;
        self.zero_range(offset, u64::from(len), false);
        self.counters.trims.fetch_add(1, Ordering::Relaxed);
        Ok(())
    }

    async fn write_zeroes(&self, offset: u64, len: u32, no_hole: bool) -> Result<(), DeviceError> {
        if self.info.read_only {
            return Err(DeviceError::ReadOnly);
        }
        self.check(offset, u64::from(len))?;
        self.zero_range(offset, u64::from(len), no_hole);
        self.counters.zero_writes.fetch_add(1, Ordering::Relaxed);
        if no_hole {
            self.counters
                .no_hole_zero_writes
                .fetch_add(1, Ordering::Relaxed);
        }
        Ok(())
    }

    async fn block_status(&self, offset: u64, len: u32) -> Result<Vec<Extent>, DeviceError> {
        self.check(offset, u64::from(len))?;
        let end = offset + u64::from(len);
        let chunks = self
            .chunks
            .read()
            .expect("no code panics while holding the lock");
        let mut out: Vec<Extent> = Vec::new();
        let mut push = |len: u64, hole: bool| {
            if len == 0 {
                return;
            }
            match out.last_mut() {
                Some(last) if last.hole == hole => last.len += len,
                _ => out.push(Extent {
                    len,
                    hole,
                    zero: hole,
                }),
            }
        };
        let mut pos = offset;
        let first = offset / CHUNK;
        let last = (end - 1) / CHUNK;
        for (&idx, _) in chunks.range(first..=last) {
            let base = idx * CHUNK;
            let chunk_start = base.max(pos);
            push(chunk_start - pos, true);
            let chunk_end = (base + CHUNK).min(end);
            push(chunk_end - chunk_start, false);
            pos = chunk_end;
        }
        push(end - pos, true);
        Ok(out)
    }
}

/// A catalogue of named [`MemDevice`]s.
#[derive(Default)]
pub struct MemExports {
    devices: Mutex<BTreeMap<String, Arc<MemDevice>>>,
}

impl MemExports {
    pub fn new() -> Self {
        Self::default()
    }

    /// Adds (or replaces) an export; `""` is the default export.
    pub fn add(&self, name: &str, device: Arc<MemDevice>) {
        self.devices
            .lock()
            .expect("no code panics while holding the lock")
            .insert(name.to_owned(), device);
    }

    /// Builder form of [`add`](Self::add).
    pub fn with(self, name: &str, device: Arc<MemDevice>) -> Self {
        self.add(name, device);
        self
    }

    pub fn get(&self, name: &str) -> Option<Arc<MemDevice>> {
        self.devices
            .lock()
            .expect("no code panics while holding the lock")
            .get(name)
            .cloned()
    }
}

#[async_trait]
impl Exports for MemExports {
    async fn open(&self, name: &str) -> Result<Arc<dyn BlockDevice>, OpenError> {
        match self.get(name) {
            Some(d) => Ok(d),
            None => Err(OpenError::NotFound(name.to_owned())),
        }
    }

    async fn list(&self) -> Result<Vec<(String, String)>, OpenError> {
        let devices = self
            .devices
            .lock()
            .expect("no code panics while holding the lock");
        Ok(devices
            .iter()
            .map(|(n, d)| (n.clone(), d.info.description.clone()))
            .collect())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rt() -> tokio::runtime::Runtime {
        tokio::runtime::Builder::new_current_thread()
            .build()
            .unwrap()
    }

    #[test]
    fn sparse_reads_writes_and_holes() {
        rt().block_on(async {
            let size = 5 * CHUNK + 100; // last chunk is short
            let d = MemDevice::new(size);
            assert_eq!(d.allocated_bytes(), 0);
            assert_eq!(
                d.block_status(0, size as u32).await.unwrap(),
                vec![Extent {
                    len: size,
                    hole: true,
                    zero: true
                }]
            );
            d.write(CHUNK - 2, Bytes::from_static(&[1, 2, 3, 4]), false)
                .await
                .unwrap();
            assert_eq!(d.allocated_bytes(), 2 * CHUNK);
            assert_eq!(
                &d.read(CHUNK - 3, 6).await.unwrap()[..],
                &[0, 1, 2, 3, 4, 0]
            );
            d.write(size - 1, Bytes::from_static(&[9]), true)
                .await
                .unwrap();
            assert_eq!(d.allocated_bytes(), 2 * CHUNK + 100);
            let bs = d.block_status(10, (size - 10) as u32).await.unwrap();
            assert_eq!(
                bs,
                vec![
                    Extent {
                        len: 2 * CHUNK - 10,
                        hole: false,
                        zero: false
                    },
                    Extent {
                        len: 3 * CHUNK,
                        hole: true,
                        zero: true
                    },
                    Extent {
                        len: 100,
                        hole: false,
                        zero: false
                    },
                ]
            );
            // A range inside one hole.
            assert_eq!(
                d.block_status(3 * CHUNK + 5, 10).await.unwrap(),
                vec![Extent {
                    len: 10,
                    hole: true,
                    zero: true
                }]
            );
            assert_eq!(d.stats().fua_writes, 1);
            assert!(d.read(size, 1).await.is_err());
            assert!(
                d.write(u64::MAX, Bytes::from_static(&[1]), false)
                    .await
                    .is_err()
            );
        });
    }

    #[test]
    fn trim_and_write_zeroes_free_or_keep_chunks() {
        rt().block_on(async {
            let d = MemDevice::new(4 * CHUNK);
            d.write(0, Bytes::from(vec![7u8; (4 * CHUNK) as usize]), false)
                .await
                .unwrap();
            assert_eq!(d.allocated_bytes(), 4 * CHUNK);
            // Whole chunk 1 freed, half of chunk 2 zeroed but kept.
            d.trim(CHUNK, (CHUNK + CHUNK / 2) as u32).await.unwrap();
            assert_eq!(d.allocated_bytes(), 3 * CHUNK);
            assert!(
                d.read(CHUNK, (CHUNK + CHUNK / 2) as u32)
                    .await
                    .unwrap()
                    .iter()
                    .all(|b| *b == 0)
            );
            assert_eq!(d.read(2 * CHUNK + CHUNK / 2, 1).await.unwrap()[0], 7);
            // Zeroing the rest of chunk 2 frees it: it became all zeros.
            d.write_zeroes(2 * CHUNK + CHUNK / 2, (CHUNK / 2) as u32, false)
                .await
                .unwrap();
            assert_eq!(d.allocated_bytes(), 2 * CHUNK);
            // NO_HOLE keeps (and allocates) the chunks.
            d.write_zeroes(CHUNK, (2 * CHUNK) as u32, true)
                .await
                .unwrap();
            assert_eq!(d.allocated_bytes(), 4 * CHUNK);
            let bs = d.block_status(0, (4 * CHUNK) as u32).await.unwrap();
            assert_eq!(
                bs,
                vec![Extent {
                    len: 4 * CHUNK,
                    hole: false,
                    zero: false
                }]
            );
            assert!(
                d.read(CHUNK, (2 * CHUNK) as u32)
                    .await
                    .unwrap()
                    .iter()
                    .all(|b| *b == 0)
            );
        });
    }

    #[test]
    fn read_only_device_refuses_writes() {
        rt().block_on(async {
            let mut info = MemDevice::new(CHUNK).info();
            info.read_only = true;
            let d = MemDevice::with_info(info);
            assert!(matches!(
                d.write(0, Bytes::from_static(&[1]), false).await,
                Err(DeviceError::ReadOnly)
            ));
            assert!(matches!(d.trim(0, 1).await, Err(DeviceError::ReadOnly)));
            assert!(matches!(
                d.write_zeroes(0, 1, true).await,
                Err(DeviceError::ReadOnly)
            ));
        });
    }

    #[test]
    fn exports_open_and_list() {
        rt().block_on(async {
            let e = MemExports::new().with("a", Arc::new(MemDevice::new(512)));
            assert!(e.open("a").await.is_ok());
            assert!(matches!(e.open("").await, Err(OpenError::NotFound(_))));
            assert_eq!(
                e.list().await.unwrap(),
                vec![("a".to_owned(), "in-memory device".to_owned())]
            );
        });
    }
}
