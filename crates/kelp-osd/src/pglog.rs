//! The PG log: one entry per write, `(epoch, version)`-stamped, stored in the omap of the PG's
//! metadata object in the same store transaction as the write itself. After a crash the log
//! and the data therefore agree; peering compares members' logs to find what each is missing,
//! and recovery replays the difference.
//!
//! Layout: the metadata object lives in the PG's collection under a namespace no client can
//! use (`INTERNAL_NAMESPACE`); its omap header holds the `PgInfo`, and each log entry is an
//! omap key `version` (8 bytes big-endian, so keys sort by version) with the encoded entry as
//! value. Each value starts with a format version byte.
//!
//! Invariants: versions are dense and increasing (`last_update.1` is the newest entry's
//! version); the log holds the entries `(tail, last_update]`; at most `max_entries` are kept.

use std::collections::{HashMap, VecDeque};

use kelp_proto::ObjectLocator;
use kelp_store::{CollectionId, ObjectId, ObjectStore, StoreError, Transaction};
use serde::{Deserialize, Serialize};

/// Namespace of Kelp's own per-PG objects; client ops in it are refused.
pub const INTERNAL_NAMESPACE: &str = "\u{1f}kelp";
const FORMAT: u8 = 1;

/// One write as the log remembers it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct LogEntry {
    pub epoch: u32,
    pub version: u64,
    pub object: ObjectLocator,
    /// The client request that made it, to answer a resent request without applying it twice.
    pub reqid: (String, u64),
    /// Whether the object was deleted by this write.
    pub deleted: bool,
}

/// The PG's persistent summary.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct PgInfo {
    /// (epoch, version) of the newest write.
    pub last_update: (u32, u64),
    /// Version just before the oldest entry still in the log.
    pub log_tail: u64,
}

/// One planned log append (see [`PgMeta::plan_append`]).
#[derive(Debug, Clone)]
pub struct LogAppend {
    coll: CollectionId,
    info: PgInfo,
    trimmed: Vec<u64>,
}

impl LogAppend {
    /// Adds the entry, the trimming and the new info to `txn`.
    pub fn stage(&self, txn: &mut Transaction, entry: &LogEntry) {
        let oid = PgMeta::meta_oid(self.coll);
        let mut add = std::collections::BTreeMap::new();
        add.insert(entry.version.to_be_bytes().to_vec(), encode(entry));
        txn.omap_set(self.coll, &oid, add);
        if !self.trimmed.is_empty() {
            txn.omap_remove(
                self.coll,
                &oid,
                self.trimmed
                    .iter()
                    .map(|v| v.to_be_bytes().to_vec())
                    .collect(),
            );
        }
        txn.omap_set_header(self.coll, &oid, encode(&self.info));
    }
}

/// In-memory view of a PG's log, kept in step with the store.
#[derive(Debug, Clone)]
pub struct PgMeta {
    pub coll: CollectionId,
    pub info: PgInfo,
    log: VecDeque<LogEntry>,
    dups: HashMap<(String, u64), u64>,
    max_entries: usize,
}

fn encode<T: Serialize>(v: &T) -> Vec<u8> {
    let mut out = vec![FORMAT];
    out.extend(postcard::to_stdvec(v).expect("encoding into a Vec cannot fail"));
    out
}

fn decode<T: for<'de> Deserialize<'de>>(bytes: &[u8], what: &str) -> Result<T, StoreError> {
    match bytes.split_first() {
        Some((&FORMAT, body)) => postcard::from_bytes(body).map_err(|e| StoreError::Failed {
            reason: format!("corrupt PG {what}: {e}"),
        }),
        Some((v, _)) => Err(StoreError::Failed {
            reason: format!("PG {what} has unknown format version {v}"),
        }),
        None => Err(StoreError::Failed {
            reason: format!("PG {what} is empty"),
        }),
    }
}

impl From<LogEntry> for kelp_proto::WireLogEntry {
    fn from(e: LogEntry) -> Self {
        kelp_proto::WireLogEntry {
            epoch: e.epoch,
            version: e.version,
            object: e.object,
            reqid: e.reqid,
            deleted: e.deleted,
        }
    }
}

impl From<kelp_proto::WireLogEntry> for LogEntry {
    fn from(e: kelp_proto::WireLogEntry) -> Self {
        LogEntry {
            epoch: e.epoch,
            version: e.version,
            object: e.object,
            reqid: e.reqid,
            deleted: e.deleted,
        }
    }
}

impl PgMeta {
    /// The metadata object of a PG.
    pub fn meta_oid(coll: CollectionId) -> ObjectId {
        ObjectId::new(coll.0.pool.0, INTERNAL_NAMESPACE, "pgmeta", coll.0.seed)
    }

    /// Queues the creation of an empty PG (collection, metadata object, info).
    pub fn create(txn: &mut Transaction, coll: CollectionId, max_entries: usize) -> PgMeta {
        let oid = Self::meta_oid(coll);
        let info = PgInfo::default();
        txn.create_collection(coll);
        txn.touch(coll, &oid);
        txn.omap_set_header(coll, &oid, encode(&info));
        PgMeta {
            coll,
            info,
            log: VecDeque::new(),
            dups: HashMap::new(),
            max_entries,
        }
    }

    /// Loads a PG's info and log from the store.
    pub fn load(
        store: &dyn ObjectStore,
        coll: CollectionId,
        max_entries: usize,
    ) -> Result<PgMeta, StoreError> {
        let oid = Self::meta_oid(coll);
        let info = match store.omap_header(coll, &oid)? {
            Some(h) => decode(&h, "info")?,
            None => PgInfo::default(),
        };
        let mut meta = PgMeta {
            coll,
            info,
            log: VecDeque::new(),
            dups: HashMap::new(),
            max_entries,
        };
        let mut after: Option<Vec<u8>> = None;
        loop {
            let page = store.omap_iter(coll, &oid, after.as_deref(), 1024)?;
            for (_, v) in &page.entries {
                let entry: LogEntry = decode(v, "log entry")?;
                meta.dups.insert(entry.reqid.clone(), entry.version);
                meta.log.push_back(entry);
            }
            match page.entries.last() {
                Some((k, _)) if page.more => after = Some(k.clone()),
                _ => break,
            }
        }
        Ok(meta)
    }

    /// The version the next write gets.
    pub fn next_version(&self) -> u64 {
        self.info.last_update.1 + 1
    }

    /// If this request was already applied (a client resend), the version it got.
    pub fn applied_version(&self, reqid: &(String, u64)) -> Option<u64> {
        self.dups.get(reqid).copied()
    }

    /// Adds `entry` to the log inside `txn` (the transaction that carries the write), updates
    /// the info, and trims the oldest entries beyond `max_entries`.
    pub fn append(&mut self, txn: &mut Transaction, entry: LogEntry) {
        let plan = self.plan_append(entry.epoch, entry.version);
        plan.stage(txn, &entry);
        self.commit_append(plan, entry);
    }

    /// What appending the next entry, `(epoch, version)`, will change: computed before the write
    /// executes, so the store transaction can be built without cloning the in-memory log (the
    /// write path's hot spot: a 3000-entry log copied per write). The PG must not change between
    /// this and `commit_append` (the caller holds the PG's write lock).
    pub fn plan_append(&self, epoch: u32, version: u64) -> LogAppend {
        debug_assert_eq!(version, self.next_version());
        let excess = (self.log.len() + 1).saturating_sub(self.max_entries);
        let mut trimmed: Vec<u64> = self.log.iter().take(excess).map(|e| e.version).collect();
        if excess > self.log.len() {
            // max_entries is 0: even the new entry is trimmed at once.
            trimmed.push(version);
        }
        let log_tail = trimmed.last().copied().unwrap_or(self.info.log_tail);
        LogAppend {
            coll: self.coll,
            info: PgInfo {
                last_update: (epoch, version),
                log_tail,
            },
            trimmed,
        }
    }

    /// Makes the in-memory log match a staged `plan` once its transaction was submitted.
    pub fn commit_append(&mut self, plan: LogAppend, entry: LogEntry) {
        debug_assert_eq!(plan.info.last_update, (entry.epoch, entry.version));
        self.dups.insert(entry.reqid.clone(), entry.version);
        self.log.push_back(entry);
        while self.log.len() > self.max_entries {
            if let Some(old) = self.log.pop_front() {
                self.dups.remove(&old.reqid);
            }
        }
        self.info = plan.info;
    }

    /// Entries newer than `version`, or `None` if the log no longer reaches back that far
    /// (the caller must then fall back to backfill).
    pub fn entries_after(&self, version: u64) -> Option<Vec<LogEntry>> {
        if version < self.info.log_tail {
            return None;
        }
        Some(
            self.log
                .iter()
                .filter(|e| e.version > version)
                .cloned()
                .collect(),
        )
    }

    /// Replaces the log's newest part with the authoritative history: keeps the entries up to
    /// `keep_through` (none when `None`, which also takes the authoritative `log_tail`), then
    /// appends `entries` (which continue from `keep_through`), all inside `txn`.
    pub fn rewrite(
        &mut self,
        txn: &mut Transaction,
        keep_through: Option<u64>,
        entries: Vec<LogEntry>,
        log_tail: u64,
        last_update: (u32, u64),
    ) {
        let oid = Self::meta_oid(self.coll);
        let keep = |e: &LogEntry| keep_through.is_some_and(|v| e.version <= v);
        let dropped: Vec<Vec<u8>> = self
            .log
            .iter()
            .filter(|e| !keep(e))
            .map(|e| e.version.to_be_bytes().to_vec())
            .collect();
        if !dropped.is_empty() {
            txn.omap_remove(self.coll, &oid, dropped);
        }
        self.log.retain(|e| keep(e));
        if keep_through.is_none() {
            self.info.log_tail = log_tail;
        }
        let mut add = std::collections::BTreeMap::new();
        for e in entries {
            add.insert(e.version.to_be_bytes().to_vec(), encode(&e));
            self.log.push_back(e);
        }
        if !add.is_empty() {
            txn.omap_set(self.coll, &oid, add);
        }
        self.info.last_update = last_update;
        self.dups = self
            .log
            .iter()
            .map(|e| (e.reqid.clone(), e.version))
            .collect();
        let mut trimmed = Vec::new();
        while self.log.len() > self.max_entries {
            if let Some(old) = self.log.pop_front() {
                self.dups.remove(&old.reqid);
                self.info.log_tail = old.version;
                trimmed.push(old.version.to_be_bytes().to_vec());
            }
        }
        if !trimmed.is_empty() {
            txn.omap_remove(self.coll, &oid, trimmed);
        }
        txn.omap_set_header(self.coll, &oid, encode(&self.info));
    }

    /// Every entry, oldest first.
    pub fn entries(&self) -> Vec<LogEntry> {
        self.log.iter().cloned().collect()
    }

    pub fn len(&self) -> usize {
        self.log.len()
    }

    pub fn is_empty(&self) -> bool {
        self.log.is_empty()
    }
}
