//! Op execution and PG-log semantics against the in-memory store.
#![allow(clippy::unwrap_used)] // test code: a failed unwrap is a failed test

use bytes::Bytes;
use kelp_osd::{Executed, Limits, LogEntry, PgMeta, Stamp, execute};
use kelp_proto::{CmpOp, ErrorCode, ObjectLocator, OpKind, OpResult};
use kelp_store::{CollectionId, MemStore, ObjectStore, Transaction};

fn setup() -> (MemStore, CollectionId) {
    let store = MemStore::new();
    let coll = CollectionId::new(1, 0);
    let mut txn = Transaction::new();
    PgMeta::create(&mut txn, coll, 100);
    store.submit(txn).unwrap().wait().unwrap();
    (store, coll)
}

fn loc(name: &str) -> ObjectLocator {
    ObjectLocator {
        pool: 1,
        namespace: String::new(),
        key: None,
        name: name.into(),
    }
}

/// Executes a write op as version `v` (not committed).
fn execute_write(
    store: &MemStore,
    coll: CollectionId,
    name: &str,
    ops: &[OpKind],
    data: &[u8],
    v: u64,
) -> Result<Executed, ErrorCode> {
    execute(
        store,
        coll,
        &loc(name),
        ops,
        &Bytes::copy_from_slice(data),
        Stamp {
            version: v,
            mtime_ns: 1_000 + v,
        },
        &Limits::default(),
    )
    .map_err(|e| e.code)
}

/// Runs a write op and commits it; returns the new version or the error code.
fn write(
    store: &MemStore,
    coll: CollectionId,
    name: &str,
    ops: &[OpKind],
    data: &[u8],
    v: u64,
) -> Result<u64, ErrorCode> {
    let done = execute_write(store, coll, name, ops, data, v)?;
    store.submit(done.txn).unwrap().wait().unwrap();
    Ok(done.version)
}

fn read(
    store: &MemStore,
    coll: CollectionId,
    name: &str,
    ops: &[OpKind],
) -> Result<(Vec<OpResult>, Vec<u8>), ErrorCode> {
    execute(
        store,
        coll,
        &loc(name),
        ops,
        &Bytes::new(),
        Stamp {
            version: 0,
            mtime_ns: 0,
        },
        &Limits::default(),
    )
    .map(|d| (d.outs, d.out_data.into_bytes().to_vec()))
    .map_err(|e| e.code)
}

#[test]
fn writes_appends_and_reads() {
    let (s, c) = setup();
    assert_eq!(
        write(&s, c, "a", &[OpKind::WriteFull { len: 5 }], b"hello", 1),
        Ok(1)
    );
    assert_eq!(
        write(
            &s,
            c,
            "a",
            &[OpKind::Append { len: 6 }, OpKind::Append { len: 1 }],
            b" world!",
            2
        ),
        Ok(2)
    );
    let (outs, data) = read(
        &s,
        c,
        "a",
        &[OpKind::Read { offset: 0, len: 0 }, OpKind::Stat],
    )
    .unwrap();
    assert_eq!(data, b"hello world!");
    assert_eq!(
        outs[1],
        OpResult::Stat {
            size: 12,
            mtime_ns: 1_002,
            version: 2
        }
    );
    assert_eq!(
        write(
            &s,
            c,
            "a",
            &[OpKind::Write { offset: 6, len: 5 }],
            b"WORLD",
            3
        ),
        Ok(3)
    );
    assert_eq!(
        read(&s, c, "a", &[OpKind::Read { offset: 6, len: 5 }])
            .unwrap()
            .1,
        b"WORLD"
    );
    assert_eq!(
        write(&s, c, "a", &[OpKind::Truncate { size: 5 }], b"", 4),
        Ok(4)
    );
    assert_eq!(
        read(
            &s,
            c,
            "a",
            &[OpKind::Read {
                offset: 0,
                len: 100
            }]
        )
        .unwrap()
        .1,
        b"hello"
    );
    assert_eq!(
        write(&s, c, "a", &[OpKind::WriteFull { len: 0 }], b"", 5),
        Ok(5)
    );
    assert_eq!(
        read(&s, c, "a", &[OpKind::Stat]).unwrap().0[0],
        OpResult::Stat {
            size: 0,
            mtime_ns: 1_005,
            version: 5
        }
    );
    assert_eq!(write(&s, c, "a", &[OpKind::Remove], b"", 6), Ok(0));
    assert_eq!(read(&s, c, "a", &[OpKind::Stat]), Err(ErrorCode::NotFound));
    assert_eq!(
        write(&s, c, "a", &[OpKind::Remove], b"", 7),
        Err(ErrorCode::NotFound)
    );
}

#[test]
fn guards_fail_without_a_trace() {
    let (s, c) = setup();
    write(
        &s,
        c,
        "g",
        &[
            OpKind::Create { exclusive: true },
            OpKind::SetXattr {
                name: "state".into(),
                len: 3,
            },
        ],
        b"new",
        1,
    )
    .unwrap();
    assert_eq!(
        write(&s, c, "g", &[OpKind::Create { exclusive: true }], b"", 2),
        Err(ErrorCode::Exists)
    );
    // wrong version: the write after the guard must not happen
    assert_eq!(
        write(
            &s,
            c,
            "g",
            &[
                OpKind::AssertVersion { version: 9 },
                OpKind::WriteFull { len: 1 }
            ],
            b"x",
            2
        ),
        Err(ErrorCode::Canceled)
    );
    assert_eq!(
        read(&s, c, "g", &[OpKind::Stat]).unwrap().0[0],
        OpResult::Stat {
            size: 0,
            mtime_ns: 1_001,
            version: 1
        }
    );
    // compare-and-swap on an xattr
    let cas = |expect: &[u8], new: &[u8], v| {
        let mut data = expect.to_vec();
        data.extend_from_slice(new);
        write(
            &s,
            c,
            "g",
            &[
                OpKind::CmpXattr {
                    name: "state".into(),
                    op: CmpOp::Eq,
                    len: expect.len() as u64,
                },
                OpKind::SetXattr {
                    name: "state".into(),
                    len: new.len() as u64,
                },
            ],
            &data,
            v,
        )
    };
    assert_eq!(cas(b"new", b"used", 2), Ok(2));
    assert_eq!(cas(b"new", b"again", 3), Err(ErrorCode::Canceled));
    assert_eq!(
        read(
            &s,
            c,
            "g",
            &[OpKind::GetXattr {
                name: "state".into()
            }]
        )
        .unwrap()
        .1,
        b"used"
    );
    assert_eq!(
        read(
            &s,
            c,
            "g",
            &[OpKind::GetXattr {
                name: "nope".into()
            }]
        ),
        Err(ErrorCode::NoData)
    );
    assert_eq!(
        write(
            &s,
            c,
            "missing",
            &[OpKind::AssertExists, OpKind::WriteFull { len: 1 }],
            b"x",
            4
        ),
        Err(ErrorCode::NotFound)
    );
    assert_eq!(
        read(&s, c, "missing", &[OpKind::Stat]),
        Err(ErrorCode::NotFound)
    );
}

#[test]
fn bad_ops_are_refused() {
    let (s, c) = setup();
    let lim = Limits::default();
    let e = |ops: &[OpKind], data: &[u8], l: &ObjectLocator| {
        execute(
            &s,
            c,
            l,
            ops,
            &Bytes::copy_from_slice(data),
            Stamp {
                version: 1,
                mtime_ns: 1,
            },
            &lim,
        )
        .unwrap_err()
        .code
    };
    assert_eq!(e(&[], b"", &loc("x")), ErrorCode::Invalid);
    assert_eq!(
        e(&[OpKind::WriteFull { len: 3 }], b"toolong", &loc("x")),
        ErrorCode::Invalid
    );
    assert_eq!(
        e(
            &[
                OpKind::WriteFull { len: 1 },
                OpKind::Read { offset: 0, len: 1 }
            ],
            b"x",
            &loc("x")
        ),
        ErrorCode::Invalid
    );
    assert_eq!(
        e(
            &[OpKind::Write {
                offset: 128 << 20,
                len: 1
            }],
            b"x",
            &loc("x")
        ),
        ErrorCode::TooBig
    );
    assert_eq!(
        e(&[OpKind::Truncate { size: u64::MAX }], b"", &loc("x")),
        ErrorCode::TooBig
    );
    let mut internal = loc("pgmeta");
    internal.namespace = "\u{1f}kelp".into();
    assert_eq!(e(&[OpKind::Stat], b"", &internal), ErrorCode::Invalid);
    assert_eq!(e(&[OpKind::Stat], b"", &loc("")), ErrorCode::Invalid);
    // a PG this OSD does not hold
    let other = CollectionId::new(1, 9);
    assert_eq!(
        execute(
            &s,
            other,
            &loc("x"),
            &[OpKind::Stat],
            &Bytes::new(),
            Stamp {
                version: 1,
                mtime_ns: 1
            },
            &lim
        )
        .unwrap_err()
        .code,
        ErrorCode::Misdirected
    );
}

#[test]
fn omap_listing_pages_and_filters() {
    let (s, c) = setup();
    let keys: Vec<String> = (0..50)
        .map(|i| format!("k{i:02}"))
        .chain(["a".into(), "z".into()])
        .collect();
    let entries: Vec<(String, u64)> = keys.iter().map(|k| (k.clone(), 2)).collect();
    let data: Vec<u8> = keys.iter().flat_map(|_| b"vv".to_vec()).collect();
    write(&s, c, "idx", &[OpKind::OmapSet { entries }], &data, 1).unwrap();
    let list = |after: &str, max| match read(
        &s,
        c,
        "idx",
        &[OpKind::OmapGetVals {
            start_after: after.into(),
            prefix: "k".into(),
            max,
        }],
    )
    .unwrap()
    .0
    .remove(0)
    {
        OpResult::Omap { entries, more } => (
            entries.into_iter().map(|(k, _)| k).collect::<Vec<_>>(),
            more,
        ),
        other => panic!("{other:?}"),
    };
    let (first, more) = list("", 20);
    assert_eq!(first.len(), 20);
    assert!(more);
    assert_eq!(first[0], "k00");
    let (rest, more) = list(first.last().unwrap(), 100);
    assert_eq!(rest.len(), 30);
    assert!(!more);
    assert!(rest.iter().all(|k| k.starts_with('k')));
    write(
        &s,
        c,
        "idx",
        &[OpKind::OmapRm {
            keys: vec!["k00".into(), "a".into()],
        }],
        b"",
        2,
    )
    .unwrap();
    let (outs, data) = read(
        &s,
        c,
        "idx",
        &[OpKind::OmapGetValsByKeys {
            keys: vec!["k00".into(), "k01".into(), "z".into()],
        }],
    )
    .unwrap();
    assert_eq!(
        outs[0],
        OpResult::Omap {
            entries: vec![("k01".into(), 2), ("z".into(), 2)],
            more: false
        }
    );
    assert_eq!(data, b"vvvv");
}

#[test]
fn replicas_applying_the_same_ops_end_up_identical() {
    let (a, c) = setup();
    let (b, _) = setup();
    let script: Vec<(Vec<OpKind>, Vec<u8>)> = vec![
        (vec![OpKind::Append { len: 3 }], b"abc".to_vec()),
        (
            vec![
                OpKind::Append { len: 2 },
                OpKind::SetXattr {
                    name: "x".into(),
                    len: 1,
                },
            ],
            b"de1".to_vec(),
        ),
        (vec![OpKind::Zero { offset: 1, len: 2 }], vec![]),
        (
            vec![OpKind::OmapSet {
                entries: vec![("k".into(), 1)],
            }],
            b"v".to_vec(),
        ),
        (vec![OpKind::Append { len: 4 }], b"wxyz".to_vec()),
    ];
    for (v, (ops, data)) in script.iter().enumerate() {
        let v = v as u64 + 1;
        assert_eq!(
            write(&a, c, "r", ops, data, v),
            write(&b, c, "r", ops, data, v)
        );
    }
    let all = [
        OpKind::Read { offset: 0, len: 0 },
        OpKind::Stat,
        OpKind::GetXattrs,
    ];
    assert_eq!(read(&a, c, "r", &all), read(&b, c, "r", &all));
    assert_eq!(read(&a, c, "r", &all).unwrap().1[..9], *b"a\0\0dewxyz");
}

#[test]
fn pg_log_persists_trims_and_remembers_requests() {
    let (s, c) = setup();
    let mut relayout = Transaction::new();
    let mut meta = PgMeta::load(&s, c, 5, &mut relayout).unwrap();
    s.submit(relayout).unwrap().wait().unwrap();
    assert_eq!(meta.next_version(), 1);
    for v in 1..=8u64 {
        let mut txn = Transaction::new();
        meta.append(
            &mut txn,
            LogEntry {
                epoch: 3,
                version: v,
                object: loc(&format!("o{v}")),
                reqid: ("client.x".into(), 100 + v),
                deleted: false,
            },
        );
        s.submit(txn).unwrap().wait().unwrap();
    }
    assert_eq!(meta.len(), 5);
    assert_eq!(meta.info.last_update, (3, 8));
    assert_eq!(meta.info.log_tail, 3);
    let loaded = PgMeta::load(&s, c, 5, &mut Transaction::new()).unwrap();
    assert_eq!(loaded.info, meta.info);
    assert_eq!(loaded.len(), 5);
    assert_eq!(loaded.applied_version(&("client.x".into(), 108)), Some(8));
    assert_eq!(
        loaded.applied_version(&("client.x".into(), 101)),
        None,
        "trimmed"
    );
    assert_eq!(
        loaded
            .entries_after(6)
            .unwrap()
            .iter()
            .map(|e| e.version)
            .collect::<Vec<_>>(),
        vec![7, 8]
    );
    assert_eq!(loaded.entries_after(3).unwrap().len(), 5);
    assert!(
        loaded.entries_after(2).is_none(),
        "the log no longer reaches version 2: backfill"
    );
}

/// `CmpOmap` makes an omap update conditional on one key's value (or absence): the index
/// compare-and-swap the S3 gateway builds on.
#[test]
fn omap_compare_guards_updates() {
    let (s, c) = setup();
    // "k" must be absent: holds on a missing object, then on an object without the key
    let put_if_absent = |key: &str, val: &[u8], v| {
        let data = val.to_vec();
        write(
            &s,
            c,
            "idx",
            &[
                OpKind::CmpOmap {
                    key: key.into(),
                    op: CmpOp::Eq,
                    len: None,
                },
                OpKind::OmapSet {
                    entries: vec![(key.into(), val.len() as u64)],
                },
            ],
            &data,
            v,
        )
    };
    assert_eq!(put_if_absent("k", b"one", 1), Ok(1));
    assert_eq!(put_if_absent("k", b"two", 2), Err(ErrorCode::Canceled));
    assert_eq!(put_if_absent("j", b"three", 2), Ok(2));
    // swap only from the expected value
    let swap = |from: &[u8], to: &[u8], v| {
        let mut data = from.to_vec();
        data.extend_from_slice(to);
        write(
            &s,
            c,
            "idx",
            &[
                OpKind::CmpOmap {
                    key: "k".into(),
                    op: CmpOp::Eq,
                    len: Some(from.len() as u64),
                },
                OpKind::OmapSet {
                    entries: vec![("k".into(), to.len() as u64)],
                },
            ],
            &data,
            v,
        )
    };
    assert_eq!(swap(b"two", b"x", 3), Err(ErrorCode::Canceled));
    assert_eq!(swap(b"one", b"four", 3), Ok(3));
    // "present" guard
    let present = |key: &str| {
        write(
            &s,
            c,
            "idx",
            &[
                OpKind::CmpOmap {
                    key: key.into(),
                    op: CmpOp::Ne,
                    len: None,
                },
                OpKind::OmapRm {
                    keys: vec![key.into()],
                },
            ],
            &[],
            4,
        )
    };
    assert_eq!(present("missing"), Err(ErrorCode::Canceled));
    assert_eq!(present("j"), Ok(4));
    let (_, data) = read(
        &s,
        c,
        "idx",
        &[OpKind::OmapGetValsByKeys {
            keys: vec!["k".into(), "j".into()],
        }],
    )
    .unwrap();
    assert_eq!(data, b"four");
}

#[test]
fn whole_object_reads_respect_osd_max_write_size() {
    let (s, c) = setup();
    assert_eq!(
        write(
            &s,
            c,
            "big",
            &[OpKind::WriteFull { len: 10 }],
            &[7u8; 10],
            1
        ),
        Ok(1)
    );
    let read_with = |max_write_size: u64, len: u64| {
        execute(
            &s,
            c,
            &loc("big"),
            &[OpKind::Read { offset: 0, len }],
            &Bytes::new(),
            Stamp {
                version: 0,
                mtime_ns: 0,
            },
            &Limits {
                max_write_size,
                ..Limits::default()
            },
        )
        .map(|d| (d.out_data.into_bytes().to_vec(), d.version))
        .map_err(|e| e.code)
    };
    assert_eq!(read_with(10, 0), Ok((vec![7u8; 10], 1)));
    assert_eq!(read_with(9, 0), Err(ErrorCode::TooBig));
    assert_eq!(read_with(9, 9), Ok((vec![7u8; 9], 1)));
    assert_eq!(read_with(9, 10), Err(ErrorCode::TooBig));
}

/// The per-write statistics deltas, summed, equal a recount of the PG (what lets the primary
/// keep its PG's object and byte counts without listing it).
#[test]
fn stat_deltas_add_up_to_a_recount() {
    let (s, c) = setup();
    let mut v = 0;
    let (mut objects, mut bytes) = (0i64, 0i64);
    /// (object, ops, data, expected (objects, bytes) delta)
    type Step = (&'static str, Vec<OpKind>, Vec<u8>, (i64, i64));
    let steps: Vec<Step> = vec![
        (
            "a",
            vec![OpKind::WriteFull { len: 5 }],
            b"hello".to_vec(),
            (1, 5),
        ),
        (
            "a",
            vec![OpKind::Write { offset: 10, len: 2 }],
            b"xy".to_vec(),
            (0, 7),
        ),
        ("a", vec![OpKind::Truncate { size: 3 }], vec![], (0, -9)),
        (
            "b",
            vec![OpKind::Create { exclusive: true }],
            vec![],
            (1, 0),
        ),
        (
            "b",
            vec![OpKind::Append { len: 4 }],
            b"abcd".to_vec(),
            (0, 4),
        ),
        (
            "b",
            vec![OpKind::Zero { offset: 0, len: 2 }],
            vec![],
            (0, 0),
        ),
        (
            "c",
            vec![OpKind::SetXattr {
                name: "k".into(),
                len: 1,
            }],
            b"v".to_vec(),
            (1, 0),
        ),
        (
            "d",
            vec![OpKind::OmapSet {
                entries: vec![("k".into(), 2)],
            }],
            b"vv".to_vec(),
            (1, 0),
        ),
        ("a", vec![OpKind::Remove], vec![], (-1, -3)),
        // removed and written again in one op: still there, with the new size
        (
            "b",
            vec![OpKind::Remove, OpKind::WriteFull { len: 1 }],
            b"z".to_vec(),
            (0, -3),
        ),
        ("a", vec![OpKind::WriteFull { len: 0 }], vec![], (1, 0)),
    ];
    for (name, ops, data, want) in steps {
        v += 1;
        let done = execute_write(&s, c, name, &ops, &data, v).unwrap();
        let d = done.stat_delta;
        assert_eq!((d.objects, d.bytes), want, "{name} {ops:?}");
        (objects, bytes) = (objects + d.objects, bytes + d.bytes);
        s.submit(done.txn).unwrap().wait().unwrap();
    }
    // a failed write changes nothing and carries no delta
    assert!(execute_write(&s, c, "gone", &[OpKind::Remove], &[], v + 1).is_err());
    let listed = s.list_objects(c, None, 1000).unwrap();
    let user: Vec<_> = listed
        .objects
        .iter()
        .filter(|o| !o.namespace.starts_with('\u{1f}'))
        .collect();
    let size: u64 = user.iter().map(|o| s.stat(c, o).unwrap().size).sum();
    assert_eq!((objects, bytes), (user.len() as i64, size as i64));
    assert_eq!((objects, bytes), (4, 1));
}
