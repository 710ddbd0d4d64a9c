//! Durable Raft storage for one monitor: the vote, the log, the committed log id and the
//! state-machine snapshot, all in one `redb` database (`DIR/mon.redb`).
//!
//! Why redb: monitor traffic is small and rare (a few entries per second at most), and redb
//! gives single-writer ACID transactions whose commit returns only after an fsync
//! (`Durability::Immediate`, its default). That is exactly what Raft needs: a vote or a log
//! append must be on disk before it is acknowledged, and that is the order here (commit, then
//! `LogFlushed::log_io_completed`).
//!
//! Invariants:
//! - every stored value starts with a format byte ([`LOG_FORMAT`], [`SNAPSHOT_FORMAT`]);
//! - the log holds the consecutive indexes `(last_purged, last]`;
//! - the state machine lives in memory; it is durable through snapshots (built by openraft's
//!   snapshot policy) plus the log: on restart the last snapshot is loaded and openraft
//!   re-applies the committed entries after it (we persist `committed` for that).

use std::fmt::Debug;
use std::io::Cursor;
use std::ops::{Bound, RangeBounds};
use std::path::Path;
use std::sync::{Arc, RwLock};

use openraft::storage::{LogFlushed, LogState, RaftLogStorage, RaftStateMachine, Snapshot};
use openraft::{
    BasicNode, Entry, EntryPayload, LogId, RaftLogReader, RaftSnapshotBuilder, SnapshotMeta,
    StorageError, StorageIOError, StoredMembership, Vote,
};
use redb::{Database, ReadableTable, TableDefinition};
use serde::Serialize;
use serde::de::DeserializeOwned;
use tokio::sync::watch;
use tracing::debug;

use crate::error::MonError;
use crate::state::MonState;
use crate::{NodeId, TypeConfig};
use kelp_proto::MonReply;

/// Format byte of log entries and Raft metadata values.
pub const LOG_FORMAT: u8 = 1;
/// Format byte of stored snapshots.
pub const SNAPSHOT_FORMAT: u8 = 1;

const META: TableDefinition<&str, &[u8]> = TableDefinition::new("raft_meta");
const LOG: TableDefinition<u64, &[u8]> = TableDefinition::new("raft_log");
const SNAP: TableDefinition<&str, &[u8]> = TableDefinition::new("snapshot");

type SErr = StorageError<NodeId>;

fn enc<T: Serialize>(format: u8, v: &T) -> Vec<u8> {
    let mut out = vec![format];
    out.extend(postcard::to_stdvec(v).expect("encoding into a Vec cannot fail"));
    out
}

fn dec<T: DeserializeOwned>(format: u8, what: &'static str, b: &[u8]) -> Result<T, MonError> {
    match b.split_first() {
        Some((&v, body)) if v == format => {
            postcard::from_bytes(body).map_err(|e| MonError::Corrupt {
                what,
                reason: e.to_string(),
            })
        }
        Some((&v, _)) => Err(MonError::UnsupportedFormat {
            what,
            got: v,
            max: format,
        }),
        None => Err(MonError::Corrupt {
            what,
            reason: "empty value".into(),
        }),
    }
}

/// Opens (creating if needed) the monitor database with all its tables.
pub fn open_db(path: &Path) -> Result<Arc<Database>, MonError> {
    let db = Database::create(path)?;
    let tx = db.begin_write()?;
    tx.open_table(META)?;
    tx.open_table(LOG)?;
    tx.open_table(SNAP)?;
    tx.commit()?;
    Ok(Arc::new(db))
}

/// Runs a blocking database closure off the async workers.
async fn blocking<T: Send + 'static>(
    f: impl FnOnce() -> Result<T, MonError> + Send + 'static,
) -> Result<T, MonError> {
    tokio::task::spawn_blocking(f)
        .await
        .map_err(|e| MonError::Db(format!("database task failed: {e}")))?
}

fn meta_get<T: DeserializeOwned>(db: &Database, key: &str) -> Result<Option<T>, MonError> {
    let tx = db.begin_read()?;
    let t = tx.open_table(META)?;
    match t.get(key)? {
        Some(v) => Ok(Some(dec(LOG_FORMAT, "raft metadata", v.value())?)),
        None => Ok(None),
    }
}

fn meta_put<T: Serialize>(db: &Database, key: &str, v: &T) -> Result<(), MonError> {
    let tx = db.begin_write()?;
    {
        let mut t = tx.open_table(META)?;
        t.insert(key, enc(LOG_FORMAT, v).as_slice())?;
    }
    tx.commit()?;
    Ok(())
}

/// The Raft log and vote (openraft's `RaftLogStorage`). Cheap to clone (the log reader is a
/// clone).
#[derive(Clone)]
pub struct LogStore {
    db: Arc<Database>,
}

impl LogStore {
    pub fn new(db: Arc<Database>) -> Self {
        LogStore { db }
    }

    fn read_range(
        db: &Database,
        range: (Bound<u64>, Bound<u64>),
    ) -> Result<Vec<Entry<TypeConfig>>, MonError> {
        let tx = db.begin_read()?;
        let t = tx.open_table(LOG)?;
        let mut out = Vec::new();
        for item in t.range::<u64>(range)? {
            let (_, v) = item?;
            out.push(dec(LOG_FORMAT, "raft log entry", v.value())?);
        }
        Ok(out)
    }
}

fn bounds<RB: RangeBounds<u64>>(r: &RB) -> (Bound<u64>, Bound<u64>) {
    (r.start_bound().cloned(), r.end_bound().cloned())
}

impl RaftLogReader<TypeConfig> for LogStore {
    async fn try_get_log_entries<RB: RangeBounds<u64> + Clone + Debug + Send>(
        &mut self,
        range: RB,
    ) -> Result<Vec<Entry<TypeConfig>>, SErr> {
        let db = self.db.clone();
        let r = bounds(&range);
        blocking(move || Self::read_range(&db, r))
            .await
            .map_err(|e| StorageIOError::read_logs(&e).into())
    }
}

impl RaftLogStorage<TypeConfig> for LogStore {
    type LogReader = LogStore;

    async fn get_log_state(&mut self) -> Result<LogState<TypeConfig>, SErr> {
        let db = self.db.clone();
        blocking(move || {
            let last_purged: Option<LogId<NodeId>> = meta_get(&db, "last_purged")?;
            let tx = db.begin_read()?;
            let t = tx.open_table(LOG)?;
            let last = match t.last()? {
                Some((_, v)) => {
                    let e: Entry<TypeConfig> = dec(LOG_FORMAT, "raft log entry", v.value())?;
                    Some(e.log_id)
                }
                None => last_purged,
            };
            Ok(LogState {
                last_purged_log_id: last_purged,
                last_log_id: last,
            })
        })
        .await
        .map_err(|e| StorageIOError::read_logs(&e).into())
    }

    async fn get_log_reader(&mut self) -> Self::LogReader {
        self.clone()
    }

    async fn save_vote(&mut self, vote: &Vote<NodeId>) -> Result<(), SErr> {
        let db = self.db.clone();
        let vote = *vote;
        blocking(move || meta_put(&db, "vote", &vote))
            .await
            .map_err(|e| StorageIOError::write_vote(&e).into())
    }

    async fn read_vote(&mut self) -> Result<Option<Vote<NodeId>>, SErr> {
        let db = self.db.clone();
        blocking(move || meta_get(&db, "vote"))
            .await
            .map_err(|e| StorageIOError::read_vote(&e).into())
    }

    async fn save_committed(&mut self, committed: Option<LogId<NodeId>>) -> Result<(), SErr> {
        let db = self.db.clone();
        blocking(move || meta_put(&db, "committed", &committed))
            .await
            .map_err(|e| StorageIOError::write(&e).into())
    }

    async fn read_committed(&mut self) -> Result<Option<LogId<NodeId>>, SErr> {
        let db = self.db.clone();
        blocking(move || Ok(meta_get::<Option<LogId<NodeId>>>(&db, "committed")?.flatten()))
            .await
            .map_err(|e| StorageIOError::read(&e).into())
    }

    async fn append<I>(&mut self, entries: I, callback: LogFlushed<TypeConfig>) -> Result<(), SErr>
    where
        I: IntoIterator<Item = Entry<TypeConfig>> + Send,
        I::IntoIter: Send,
    {
        let encoded: Vec<(u64, Vec<u8>)> = entries
            .into_iter()
            .map(|e| (e.log_id.index, enc(LOG_FORMAT, &e)))
            .collect();
        let db = self.db.clone();
        let res = blocking(move || {
            let tx = db.begin_write()?;
            {
                let mut t = tx.open_table(LOG)?;
                for (i, b) in &encoded {
                    t.insert(*i, b.as_slice())?;
                }
            }
            // Durability::Immediate (the default): returns after fsync.
            tx.commit()?;
            Ok(())
        })
        .await;
        match res {
            Ok(()) => {
                callback.log_io_completed(Ok(()));
                Ok(())
            }
            Err(e) => {
                callback.log_io_completed(Err(std::io::Error::other(e.to_string())));
                Err(StorageIOError::write_logs(&e).into())
            }
        }
    }

    async fn truncate(&mut self, log_id: LogId<NodeId>) -> Result<(), SErr> {
        let db = self.db.clone();
        blocking(move || {
            let tx = db.begin_write()?;
            {
                let mut t = tx.open_table(LOG)?;
                t.retain_in::<u64, _>(log_id.index.., |_, _| false)?;
            }
            tx.commit()?;
            Ok(())
        })
        .await
        .map_err(|e| StorageIOError::write_logs(&e).into())
    }

    async fn purge(&mut self, log_id: LogId<NodeId>) -> Result<(), SErr> {
        let db = self.db.clone();
        blocking(move || {
            let tx = db.begin_write()?;
            {
                let mut m = tx.open_table(META)?;
                m.insert("last_purged", enc(LOG_FORMAT, &Some(log_id)).as_slice())?;
                let mut t = tx.open_table(LOG)?;
                t.retain_in::<u64, _>(..=log_id.index, |_, _| false)?;
            }
            tx.commit()?;
            Ok(())
        })
        .await
        .map_err(|e| StorageIOError::write_logs(&e).into())
    }
}

/// What the state machine keeps besides [`MonState`].
pub struct Applied {
    pub last_applied: Option<LogId<NodeId>>,
    pub membership: StoredMembership<NodeId, BasicNode>,
    pub state: MonState,
}

/// State shared between the state machine (writer) and the daemon (readers: command handlers,
/// subscriptions, the key lookup).
pub struct Shared {
    pub applied: RwLock<Applied>,
    /// The OSD map epoch after the last apply; subscribers' pushers wait on it.
    pub epoch_tx: watch::Sender<u32>,
}

impl Shared {
    pub fn read(&self) -> std::sync::RwLockReadGuard<'_, Applied> {
        self.applied.read().unwrap_or_else(|p| p.into_inner())
    }
    fn write(&self) -> std::sync::RwLockWriteGuard<'_, Applied> {
        self.applied.write().unwrap_or_else(|p| p.into_inner())
    }
}

#[derive(serde::Serialize, serde::Deserialize)]
struct StoredSnapshot {
    meta: SnapshotMeta<NodeId, BasicNode>,
    data: Vec<u8>,
}

/// The monitors' state machine (openraft's `RaftStateMachine`).
#[derive(Clone)]
pub struct StateMachine {
    db: Arc<Database>,
    shared: Arc<Shared>,
}

impl StateMachine {
    /// Loads the last snapshot, if any.
    pub fn open(db: Arc<Database>) -> Result<StateMachine, MonError> {
        let mut applied = Applied {
            last_applied: None,
            membership: StoredMembership::default(),
            state: MonState::default(),
        };
        if let Some(snap) = load_snapshot(&db)? {
            applied.state = MonState::decode(&snap.data)?;
            applied.last_applied = snap.meta.last_log_id;
            applied.membership = snap.meta.last_membership.clone();
        }
        let (epoch_tx, _) = watch::channel(applied.state.epoch());
        Ok(StateMachine {
            db,
            shared: Arc::new(Shared {
                applied: RwLock::new(applied),
                epoch_tx,
            }),
        })
    }

    pub fn shared(&self) -> Arc<Shared> {
        self.shared.clone()
    }
}

fn load_snapshot(db: &Database) -> Result<Option<StoredSnapshot>, MonError> {
    let tx = db.begin_read()?;
    let t = tx.open_table(SNAP)?;
    match t.get("current")? {
        Some(v) => Ok(Some(dec(SNAPSHOT_FORMAT, "snapshot", v.value())?)),
        None => Ok(None),
    }
}

fn save_snapshot(db: &Database, snap: &StoredSnapshot) -> Result<(), MonError> {
    let tx = db.begin_write()?;
    {
        let mut t = tx.open_table(SNAP)?;
        t.insert("current", enc(SNAPSHOT_FORMAT, snap).as_slice())?;
    }
    tx.commit()?;
    Ok(())
}

impl RaftSnapshotBuilder<TypeConfig> for StateMachine {
    async fn build_snapshot(&mut self) -> Result<Snapshot<TypeConfig>, SErr> {
        let (data, last, membership) = {
            let a = self.shared.read();
            (a.state.encode(), a.last_applied, a.membership.clone())
        };
        let snapshot_id = match last {
            Some(l) => format!("{}-{}-{}", l.leader_id, l.index, data.len()),
            None => format!("none-{}", data.len()),
        };
        let meta = SnapshotMeta {
            last_log_id: last,
            last_membership: membership,
            snapshot_id,
        };
        let stored = StoredSnapshot {
            meta: meta.clone(),
            data: data.clone(),
        };
        let db = self.db.clone();
        blocking(move || save_snapshot(&db, &stored))
            .await
            .map_err(|e| StorageIOError::write_snapshot(Some(meta.signature()), &e))?;
        debug!(last = ?last, bytes = data.len(), "snapshot built");
        Ok(Snapshot {
            meta,
            snapshot: Box::new(Cursor::new(data)),
        })
    }
}

impl RaftStateMachine<TypeConfig> for StateMachine {
    type SnapshotBuilder = StateMachine;

    async fn applied_state(
        &mut self,
    ) -> Result<(Option<LogId<NodeId>>, StoredMembership<NodeId, BasicNode>), SErr> {
        let a = self.shared.read();
        Ok((a.last_applied, a.membership.clone()))
    }

    async fn apply<I>(&mut self, entries: I) -> Result<Vec<MonReply>, SErr>
    where
        I: IntoIterator<Item = Entry<TypeConfig>> + Send,
        I::IntoIter: Send,
    {
        let mut replies = Vec::new();
        let epoch = {
            let mut a = self.shared.write();
            for entry in entries {
                a.last_applied = Some(entry.log_id);
                let reply = match &entry.payload {
                    EntryPayload::Blank => MonReply::Done {
                        epoch: a.state.epoch(),
                    },
                    EntryPayload::Normal(e) => a.state.apply(e),
                    EntryPayload::Membership(m) => {
                        a.membership = StoredMembership::new(Some(entry.log_id), m.clone());
                        MonReply::Done {
                            epoch: a.state.epoch(),
                        }
                    }
                };
                replies.push(reply);
            }
            a.state.epoch()
        };
        self.shared.epoch_tx.send_if_modified(|e| {
            let changed = *e != epoch;
            *e = epoch;
            changed
        });
        Ok(replies)
    }

    async fn get_snapshot_builder(&mut self) -> Self::SnapshotBuilder {
        self.clone()
    }

    async fn begin_receiving_snapshot(&mut self) -> Result<Box<Cursor<Vec<u8>>>, SErr> {
        Ok(Box::new(Cursor::new(Vec::new())))
    }

    async fn install_snapshot(
        &mut self,
        meta: &SnapshotMeta<NodeId, BasicNode>,
        snapshot: Box<Cursor<Vec<u8>>>,
    ) -> Result<(), SErr> {
        let data = snapshot.into_inner();
        let state = MonState::decode(&data)
            .map_err(|e| StorageIOError::read_snapshot(Some(meta.signature()), &e))?;
        let stored = StoredSnapshot {
            meta: meta.clone(),
            data,
        };
        let db = self.db.clone();
        let sig = meta.signature();
        blocking(move || save_snapshot(&db, &stored))
            .await
            .map_err(|e| StorageIOError::write_snapshot(Some(sig), &e))?;
        let epoch = {
            let mut a = self.shared.write();
            a.state = state;
            a.last_applied = meta.last_log_id;
            a.membership = meta.last_membership.clone();
            a.state.epoch()
        };
        self.shared.epoch_tx.send_replace(epoch);
        Ok(())
    }

    async fn get_current_snapshot(&mut self) -> Result<Option<Snapshot<TypeConfig>>, SErr> {
        let db = self.db.clone();
        let snap = blocking(move || load_snapshot(&db))
            .await
            .map_err(|e| StorageIOError::read_snapshot(None, &e))?;
        Ok(snap.map(|s| Snapshot {
            meta: s.meta,
            snapshot: Box::new(Cursor::new(s.data)),
        }))
    }
}
