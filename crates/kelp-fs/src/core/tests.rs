//! Namespace core tests: a driver that keeps the "stored" objects in memory (as the
//! checkpoint writes them), applies operations, answers `Need`s from the store, and often
//! evicts the whole cache to prove that every operation loads what it reads.

use super::*;

#[derive(Default)]
struct Store {
    inodes: HashMap<Ino, Inode>,
    dirs: HashMap<Ino, BTreeMap<String, Dentry>>,
    /// What a replay of the journal rebuilds: the next inode number, the completed requests.
    next_ino: Ino,
    requests: requests::RequestTable,
    /// Every update in order (what the journal holds).
    journal: Vec<Update>,
    /// The advisory locks a replay rebuilds.
    locks: crate::locks::StoredLocks,
    /// Inline data, as the inline shards hold it.
    inline: HashMap<Ino, bytes::Bytes>,
}

impl Store {
    fn apply(&mut self, updates: &[Update]) {
        self.journal.extend_from_slice(updates);
        for u in updates {
            match u {
                Update::PutInode(i) => {
                    self.inodes.insert(i.ino, i.clone());
                    if i.is_dir() {
                        self.dirs.entry(i.ino).or_default();
                    }
                }
                Update::DelInode(i) => {
                    self.inodes.remove(i);
                }
                Update::PutDentry {
                    dir, name, dentry, ..
                } => {
                    self.dirs
                        .entry(*dir)
                        .or_default()
                        .insert(name.clone(), *dentry);
                }
                Update::DelDentry { dir, name, .. } => {
                    self.dirs.entry(*dir).or_default().remove(name);
                }
                Update::DelDir(d) => {
                    self.dirs.remove(d);
                }
                Update::NextIno(n) => self.next_ino = self.next_ino.max(*n),
                Update::Request { .. } => self.requests.apply(u),
                Update::PutInline { ino, data } => {
                    self.inline.insert(*ino, data.0.clone());
                }
                Update::DelInline(ino) => {
                    self.inline.remove(ino);
                }
                Update::Locks { ino, held } => {
                    if held.is_empty() {
                        self.locks.locks.remove(ino);
                    } else {
                        self.locks.locks.insert(*ino, held.clone());
                    }
                }
                _ => {}
            }
        }
    }
}

struct Fs {
    ns: Namespace,
    store: Store,
    evict: bool,
}

const ROOT: Caller = Caller { uid: 0, gid: 0 };
const USER: Caller = Caller {
    uid: 1000,
    gid: 1000,
};

impl Fs {
    fn new(evict: bool) -> Fs {
        let mut ns = Namespace::new(FIRST_INO);
        let mut store = Store::default();
        store.apply(&ns.make_root(Time::default()));
        Fs { ns, store, evict }
    }

    fn run(&mut self, op: Op) -> Reply {
        self.run_as(ROOT, op)
    }

    fn ino(&mut self, parent: Ino, name: &str) -> Ino {
        match self.run(Op::Lookup {
            parent,
            name: name.into(),
        }) {
            Reply::Attr(i) => i.ino,
            r => panic!("lookup {name}: {r:?}"),
        }
    }

    fn attr(&mut self, ino: Ino) -> Inode {
        match self.run(Op::GetAttr { ino }) {
            Reply::Attr(i) => i,
            r => panic!("{r:?}"),
        }
    }

    fn mkdir(&mut self, parent: Ino, name: &str) -> Ino {
        match self.run(Op::Mkdir {
            parent,
            name: name.into(),
            mode: 0o755,
        }) {
            Reply::Attr(i) => i.ino,
            r => panic!("mkdir {name}: {r:?}"),
        }
    }

    fn create(&mut self, parent: Ino, name: &str) -> Ino {
        match self.run(Op::Mknod {
            parent,
            name: name.into(),
            mode: S_IFREG | 0o644,
            rdev: 0,
            exclusive: true,
            open: false,
            write: false,
        }) {
            Reply::Attr(i) => i.ino,
            r => panic!("create {name}: {r:?}"),
        }
    }

    fn rename(&mut self, p: Ino, n: &str, np: Ino, nn: &str) -> Reply {
        self.run(Op::Rename {
            parent: p,
            name: n.into(),
            new_parent: np,
            new_name: nn.into(),
            flags: 0,
        })
    }

    fn names(&mut self, dir: Ino) -> Vec<String> {
        match self.run(Op::ReadDir {
            ino: dir,
            after: None,
            max: 1000,
        }) {
            Reply::Entries { entries, .. } => entries.into_iter().map(|(n, _)| n).collect(),
            r => panic!("{r:?}"),
        }
    }
}

fn both(f: impl Fn(&mut Fs)) {
    f(&mut Fs::new(false));
    f(&mut Fs::new(true));
}

#[test]
fn create_lookup_and_directory_link_counts() {
    both(|fs| {
        let a = fs.mkdir(ROOT_INO, "a");
        let f = fs.create(a, "f");
        assert_eq!(fs.ino(a, "f"), f);
        assert_eq!(fs.attr(ROOT_INO).nlink, 3);
        assert_eq!(fs.attr(a).nlink, 2);
        assert_eq!(fs.attr(f).nlink, 1);
        assert_eq!(
            fs.run(Op::Mkdir {
                parent: a,
                name: "f".into(),
                mode: 0o700
            }),
            Reply::Err(errno::EEXIST)
        );
        assert_eq!(
            fs.run(Op::Lookup {
                parent: a,
                name: "nope".into()
            }),
            Reply::Err(errno::ENOENT)
        );
        assert_eq!(
            fs.run(Op::Lookup {
                parent: f,
                name: "x".into()
            }),
            Reply::Err(errno::ENOTDIR)
        );
        let long = "x".repeat(256);
        assert_eq!(
            fs.run(Op::Mknod {
                parent: a,
                name: long,
                mode: S_IFREG | 0o644,
                rdev: 0,
                exclusive: true,
                open: false,
                write: false
            }),
            Reply::Err(errno::ENAMETOOLONG)
        );
    });
}

#[test]
fn hard_links_and_unlink() {
    both(|fs| {
        let f = fs.create(ROOT_INO, "f");
        assert_eq!(
            fs.run(Op::Link {
                ino: f,
                parent: ROOT_INO,
                name: "g".into()
            }),
            Reply::Attr(fs.attr(f))
        );
        assert_eq!(fs.attr(f).nlink, 2);
        assert_eq!(
            fs.run(Op::Unlink {
                parent: ROOT_INO,
                name: "f".into()
            }),
            Reply::Ok
        );
        assert_eq!(fs.attr(f).nlink, 1);
        assert_eq!(fs.ino(ROOT_INO, "g"), f);
        fs.run(Op::Unlink {
            parent: ROOT_INO,
            name: "g".into(),
        });
        assert_eq!(fs.names(ROOT_INO), Vec::<String>::new());
        assert!(
            !fs.store.inodes.contains_key(&f),
            "an empty closed file is removed"
        );
        let d = fs.mkdir(ROOT_INO, "d");
        assert_eq!(
            fs.run(Op::Link {
                ino: d,
                parent: ROOT_INO,
                name: "d2".into()
            }),
            Reply::Err(errno::EPERM)
        );
        assert_eq!(
            fs.run(Op::Unlink {
                parent: ROOT_INO,
                name: "d".into()
            }),
            Reply::Err(errno::EISDIR)
        );
    });
}

#[test]
fn rename_rules() {
    both(|fs| {
        let a = fs.mkdir(ROOT_INO, "a");
        let b = fs.mkdir(a, "b");
        let c = fs.mkdir(ROOT_INO, "c");
        fs.create(c, "x");
        let f = fs.create(ROOT_INO, "f");
        // into its own subdirectory
        assert_eq!(fs.rename(ROOT_INO, "a", b, "a"), Reply::Err(errno::EINVAL));
        assert_eq!(fs.rename(ROOT_INO, "a", a, "z"), Reply::Err(errno::EINVAL));
        // over a non-empty directory
        assert_eq!(
            fs.rename(a, "b", ROOT_INO, "c"),
            Reply::Err(errno::ENOTEMPTY)
        );
        // dir over file / file over dir
        assert_eq!(fs.rename(a, "b", ROOT_INO, "f"), Reply::Err(errno::ENOTDIR));
        assert_eq!(
            fs.rename(ROOT_INO, "f", ROOT_INO, "a"),
            Reply::Err(errno::EISDIR)
        );
        // across directories
        assert_eq!(fs.rename(a, "b", c, "b2"), Reply::Ok);
        assert_eq!(fs.attr(b).parent, c);
        assert_eq!(fs.attr(a).nlink, 2);
        assert_eq!(fs.attr(c).nlink, 3);
        // over an empty directory
        let e = fs.mkdir(ROOT_INO, "e");
        assert_eq!(fs.rename(c, "b2", ROOT_INO, "e"), Reply::Ok);
        assert_eq!(fs.ino(ROOT_INO, "e"), b);
        assert!(!fs.store.inodes.contains_key(&e));
        assert_eq!(fs.attr(ROOT_INO).nlink, 2 + 3); // a, c, e
        // over a file
        let g = fs.create(ROOT_INO, "g");
        assert_eq!(fs.rename(ROOT_INO, "f", ROOT_INO, "g"), Reply::Ok);
        assert_eq!(fs.ino(ROOT_INO, "g"), f);
        assert!(!fs.store.inodes.contains_key(&g));
        assert_eq!(
            fs.run(Op::Rename {
                parent: c,
                name: "x".into(),
                new_parent: ROOT_INO,
                new_name: "g".into(),
                flags: RENAME_NOREPLACE
            }),
            Reply::Err(errno::EEXIST)
        );
        let mut names = fs.names(ROOT_INO);
        names.sort();
        assert_eq!(names, ["a", "c", "e", "g"]);
    });
}

#[test]
fn rmdir_and_setattr_and_xattrs() {
    both(|fs| {
        let d = fs.mkdir(ROOT_INO, "d");
        fs.create(d, "f");
        assert_eq!(
            fs.run(Op::Rmdir {
                parent: ROOT_INO,
                name: "d".into()
            }),
            Reply::Err(errno::ENOTEMPTY)
        );
        let f = fs.ino(d, "f");
        let set = SetAttr {
            mode: Some(0o4711),
            uid: Some(12),
            gid: Some(34),
            size: Some(99),
            atime: Some(SetTime::At(Time { secs: 1, nanos: 2 })),
            mtime: None,
        };
        let Reply::Attr(i) = fs.run(Op::SetAttr { ino: f, set }) else {
            panic!()
        };
        assert_eq!(
            (i.mode, i.uid, i.gid, i.size, i.atime.secs),
            (S_IFREG | 0o4711, 12, 34, 99, 1)
        );
        let x = |fs: &mut Fs, flags| {
            fs.run(Op::SetXattr {
                ino: f,
                name: "user.k".into(),
                value: b"v".to_vec(),
                flags,
            })
        };
        assert_eq!(x(fs, XATTR_REPLACE), Reply::Err(errno::ENODATA));
        assert_eq!(x(fs, XATTR_CREATE), Reply::Ok);
        assert_eq!(x(fs, XATTR_CREATE), Reply::Err(errno::EEXIST));
        assert_eq!(
            fs.run(Op::GetXattr {
                ino: f,
                name: "user.k".into()
            }),
            Reply::Xattr(b"v".to_vec())
        );
        assert_eq!(
            fs.run(Op::ListXattr { ino: f }),
            Reply::XattrNames(vec!["user.k".into()])
        );
        fs.run(Op::Unlink {
            parent: d,
            name: "f".into(),
        });
        assert_eq!(
            fs.run(Op::Rmdir {
                parent: ROOT_INO,
                name: "d".into()
            }),
            Reply::Ok
        );
        assert_eq!(fs.attr(ROOT_INO).nlink, 2);
        // the file had data (size 99): a stray until purged
        assert_eq!(fs.ns.purgeable(), vec![f]);
    });
}

#[test]
fn open_unlinked_files_stay_until_closed() {
    let mut fs = Fs::new(false);
    let f = fs.create(ROOT_INO, "f");
    assert!(matches!(
        fs.run(Op::Open {
            ino: f,
            write: false
        }),
        Reply::Attr(_)
    ));
    fs.run(Op::Unlink {
        parent: ROOT_INO,
        name: "f".into(),
    });
    assert_eq!(fs.attr(f).nlink, 0);
    assert!(fs.ns.purgeable().is_empty());
    fs.run(Op::Close { ino: f });
    assert_eq!(fs.ns.purgeable(), vec![f]);
}

#[test]
fn setgid_directories_pass_their_group_on() {
    let mut fs = Fs::new(false);
    let d = fs.mkdir(ROOT_INO, "d");
    fs.run(Op::SetAttr {
        ino: d,
        set: SetAttr {
            mode: Some(0o2775),
            gid: Some(50),
            ..SetAttr::default()
        },
    });
    let Reply::Attr(sub) = fs.run(Op::Mkdir {
        parent: d,
        name: "s".into(),
        mode: 0o755,
    }) else {
        panic!()
    };
    assert_eq!(sub.gid, 50);
    assert_ne!(sub.mode & S_ISGID, 0);
}

#[test]
fn rename_a_directory_over_an_empty_sibling() {
    both(|fs| {
        let q = fs.mkdir(ROOT_INO, "q");
        let full = fs.mkdir(q, "full");
        fs.mkdir(q, "empty");
        assert_eq!(fs.rename(q, "full", q, "empty"), Reply::Ok);
        assert_eq!(fs.names(q), ["empty"]);
        assert_eq!(fs.ino(q, "empty"), full);
        assert_eq!(fs.attr(q).nlink, 3);
    });
}

#[test]
fn failed_renames_leave_no_trace() {
    both(|fs| {
        let q = fs.mkdir(ROOT_INO, "q");
        let full = fs.mkdir(q, "full");
        let empty = fs.mkdir(q, "empty");
        fs.create(full, "x");
        fs.create(q, "file");
        assert_eq!(
            fs.rename(q, "empty", q, "full"),
            Reply::Err(errno::ENOTEMPTY)
        );
        assert_eq!(
            fs.rename(ROOT_INO, "q", empty, "in"),
            Reply::Err(errno::EINVAL)
        );
        assert_eq!(fs.rename(q, "file", q, "empty"), Reply::Err(errno::EISDIR));
        assert_eq!(fs.rename(q, "empty", q, "file"), Reply::Err(errno::ENOTDIR));
        assert_eq!(fs.rename(full, "x", q, "x2"), Reply::Ok);
        assert_eq!(fs.rename(q, "full", q, "empty"), Reply::Ok);
        assert_eq!(fs.names(q), ["empty", "file", "x2"]);
        assert_eq!(fs.attr(q).nlink, 3);
    });
}

// ---- recursive statistics and quotas ----

impl Fs {
    fn run_as(&mut self, caller: Caller, op: Op) -> Reply {
        for _ in 0..100 {
            match self.ns.apply(7, caller, &op, Time { secs: 5, nanos: 0 }) {
                Step::Done { reply, updates, .. } => {
                    self.store.apply(&updates);
                    if self.evict {
                        self.ns.mark_clean();
                        self.ns.evict_to(0);
                    }
                    return reply;
                }
                Step::Need(n) => self.load(n),
            }
        }
        panic!("op never completed: {op:?}");
    }

    fn stat(&mut self, dir: Ino) -> (u64, u64) {
        let s = self.attr(dir).dirstat;
        (s.rbytes, s.rentries)
    }

    fn written(&mut self, ino: Ino, end: u64) -> Reply {
        self.run(Op::Written {
            ino,
            end,
            mtime: Time { secs: 6, nanos: 0 },
            renew: false,
            ctime: None,
            set: None,
        })
    }

    fn setx(&mut self, ino: Ino, name: &str, v: &str) -> Reply {
        self.run(Op::SetXattr {
            ino,
            name: name.into(),
            value: v.as_bytes().to_vec(),
            flags: 0,
        })
    }

    fn getx(&mut self, ino: Ino, name: &str) -> Reply {
        self.run(Op::GetXattr {
            ino,
            name: name.into(),
        })
    }
}

#[test]
fn recursive_statistics_follow_creates_writes_truncates_renames_and_unlinks() {
    both(|fs| {
        let a = fs.mkdir(ROOT_INO, "a");
        let b = fs.mkdir(a, "b");
        let f = fs.create(b, "f");
        assert!(matches!(fs.written(f, 1000), Reply::Attr(_)));
        assert_eq!(fs.stat(b), (1000, 1));
        assert_eq!(fs.stat(a), (1000, 2));
        assert_eq!(fs.stat(ROOT_INO), (1000, 3));
        // overwrites inside the file change nothing
        fs.written(f, 500);
        assert_eq!(fs.stat(ROOT_INO), (1000, 3));
        let r = fs.run(Op::SetAttr {
            ino: f,
            set: SetAttr {
                size: Some(10),
                ..SetAttr::default()
            },
        });
        assert!(matches!(r, Reply::Attr(_)), "{r:?}");
        assert_eq!(fs.stat(a), (10, 2));
        // a move out of `a` takes the bytes and the entry with it
        assert_eq!(fs.rename(b, "f", ROOT_INO, "g"), Reply::Ok);
        assert_eq!(fs.stat(b), (0, 0));
        assert_eq!(fs.stat(a), (0, 1));
        assert_eq!(fs.stat(ROOT_INO), (10, 3));
        // so does a whole directory
        assert_eq!(fs.rename(ROOT_INO, "g", b, "g"), Reply::Ok);
        let c = fs.mkdir(ROOT_INO, "c");
        assert_eq!(fs.rename(a, "b", c, "b"), Reply::Ok);
        assert_eq!(fs.stat(a), (0, 0));
        assert_eq!(fs.stat(c), (10, 2));
        assert_eq!(fs.stat(ROOT_INO), (10, 4));
        assert_eq!(
            fs.run(Op::Unlink {
                parent: b,
                name: "g".into()
            }),
            Reply::Ok
        );
        assert_eq!(fs.stat(c), (0, 1));
        assert_eq!(fs.stat(ROOT_INO), (0, 3));
        // the statistics read as virtual attributes
        let r = fs.run(Op::GetXattr {
            ino: ROOT_INO,
            name: XATTR_DIR_RENTRIES.into(),
        });
        assert_eq!(r, Reply::Xattr(b"3".to_vec()));
    });
}

#[test]
fn hard_links_count_once_under_their_primary_link() {
    both(|fs| {
        let a = fs.mkdir(ROOT_INO, "a");
        let b = fs.mkdir(ROOT_INO, "b");
        let f = fs.create(a, "f");
        fs.written(f, 100);
        let r = fs.run(Op::Link {
            ino: f,
            parent: b,
            name: "f2".into(),
        });
        assert!(matches!(r, Reply::Attr(_)), "{r:?}");
        assert_eq!(fs.stat(a), (100, 1));
        assert_eq!(fs.stat(b), (0, 0));
        // the primary link goes: nothing counts the file any more ...
        fs.run(Op::Unlink {
            parent: a,
            name: "f".into(),
        });
        assert_eq!(fs.stat(a), (0, 0));
        assert_eq!(fs.stat(ROOT_INO), (0, 2));
        fs.written(f, 200);
        assert_eq!(fs.stat(ROOT_INO), (0, 2));
        // ... until a new link adopts it
        fs.run(Op::Link {
            ino: f,
            parent: a,
            name: "f3".into(),
        });
        assert_eq!(fs.stat(a), (200, 1));
        assert_eq!(fs.stat(ROOT_INO), (200, 3));
    });
}

#[test]
fn quotas_refuse_growth_past_them_and_only_root_sets_them() {
    both(|fs| {
        let q = fs.mkdir(ROOT_INO, "q");
        let sub = fs.mkdir(q, "sub");
        assert_eq!(fs.setx(q, XATTR_QUOTA_MAX_FILES, "3"), Reply::Ok);
        assert_eq!(fs.setx(q, XATTR_QUOTA_MAX_BYTES, "100\n"), Reply::Ok);
        let f = fs.create(sub, "f");
        fs.create(q, "g");
        // the fourth entry below q is refused, in a subdirectory too, and leaves no trace
        let r = fs.run(Op::Mknod {
            parent: sub,
            name: "h".into(),
            mode: S_IFREG | 0o644,
            rdev: 0,
            exclusive: true,
            open: false,
            write: false,
        });
        assert_eq!(r, Reply::Err(errno::EDQUOT));
        let r = fs.run(Op::Mkdir {
            parent: q,
            name: "d".into(),
            mode: 0o755,
        });
        assert_eq!(r, Reply::Err(errno::EDQUOT));
        assert_eq!(fs.names(sub), vec!["f".to_string()]);
        assert_eq!(fs.stat(q), (0, 3));
        // bytes
        assert!(matches!(fs.written(f, 100), Reply::Attr(_)));
        assert_eq!(fs.written(f, 101), Reply::Err(errno::EDQUOT));
        assert_eq!(fs.attr(f).size, 100);
        let r = fs.run(Op::SetAttr {
            ino: f,
            set: SetAttr {
                size: Some(4096),
                ..SetAttr::default()
            },
        });
        assert_eq!(r, Reply::Err(errno::EDQUOT));
        // a move into the quota it would exceed is EXDEV (mv copies, and the copy fails)
        let big = fs.create(ROOT_INO, "big");
        fs.written(big, 50);
        assert_eq!(
            fs.rename(ROOT_INO, "big", q, "big"),
            Reply::Err(errno::EXDEV)
        );
        // moves inside the quota are free
        assert_eq!(fs.rename(sub, "f", q, "f"), Reply::Ok);
        assert_eq!(fs.stat(q), (100, 3));
        // read back; only root sets; files have no quota; removing clears
        let r = fs.run(Op::GetXattr {
            ino: q,
            name: XATTR_QUOTA_MAX_BYTES.into(),
        });
        assert_eq!(r, Reply::Xattr(b"100".to_vec()));
        let r = fs.run_as(
            USER,
            Op::SetXattr {
                ino: q,
                name: XATTR_QUOTA_MAX_BYTES.into(),
                value: b"1000000".to_vec(),
                flags: 0,
            },
        );
        assert_eq!(r, Reply::Err(errno::EPERM));
        assert_eq!(
            fs.setx(f, XATTR_QUOTA_MAX_BYTES, "5"),
            Reply::Err(errno::EINVAL)
        );
        assert_eq!(
            fs.setx(q, XATTR_QUOTA_MAX_BYTES, "lots"),
            Reply::Err(errno::EINVAL)
        );
        assert_eq!(fs.setx(q, XATTR_DIR_RBYTES, "5"), Reply::Err(errno::EPERM));
        let r = fs.run(Op::RemoveXattr {
            ino: q,
            name: XATTR_QUOTA_MAX_BYTES.into(),
        });
        assert_eq!(r, Reply::Ok);
        assert!(matches!(fs.written(f, 5000), Reply::Attr(_)));
        assert_eq!(
            fs.rename(ROOT_INO, "big", q, "big"),
            Reply::Err(errno::EXDEV)
        ); // files: 4 > 3
        assert_eq!(fs.setx(q, XATTR_QUOTA_MAX_FILES, "0"), Reply::Ok);
        assert_eq!(fs.rename(ROOT_INO, "big", q, "big"), Reply::Ok);
        assert_eq!(fs.stat(q), (5050, 4));
        // the quota attributes are not listed
        match fs.run(Op::ListXattr { ino: q }) {
            Reply::XattrNames(n) => assert!(n.is_empty(), "{n:?}"),
            r => panic!("{r:?}"),
        }
    });
}

#[test]
fn an_open_for_writing_tells_whether_a_byte_quota_is_above() {
    both(|fs| {
        let q = fs.mkdir(ROOT_INO, "q");
        let sub = fs.mkdir(q, "sub");
        let free = fs.create(ROOT_INO, "free");
        let under = fs.create(sub, "under");
        assert_eq!(fs.setx(q, XATTR_QUOTA_MAX_BYTES, "100"), Reply::Ok);
        for (f, want) in [(free, false), (under, true)] {
            let r = fs.run(Op::Open {
                ino: f,
                write: true,
            });
            assert!(matches!(r, Reply::Attr(_)));
            // the open loaded every directory above the file (when nothing is evicted after
            // it; the daemon asks before evicting)
            let got = fs.ns.byte_quota_above(f);
            if fs.evict {
                assert!(got.is_none() || got == Some(want));
            } else {
                assert_eq!(got, Some(want));
            }
        }
        // a files-only quota does not matter
        assert_eq!(fs.setx(q, XATTR_QUOTA_MAX_BYTES, "0"), Reply::Ok);
        assert_eq!(fs.setx(q, XATTR_QUOTA_MAX_FILES, "10"), Reply::Ok);
        if !fs.evict {
            assert_eq!(fs.ns.byte_quota_above(under), Some(false));
        }
    });
}

#[test]
fn layouts_pass_down_to_new_files_and_only_empty_files_change_theirs() {
    both(|fs| {
        let pools = BTreeMap::from([("data".to_string(), 3), ("ec".to_string(), 9)]);
        fs.ns.set_data_pools(pools, 3);
        let a = fs.mkdir(ROOT_INO, "a");
        let sub = fs.mkdir(a, "sub"); // made before the layout: still below it
        assert_eq!(fs.setx(a, XATTR_DIR_LAYOUT_POOL, "ec"), Reply::Ok);
        assert_eq!(
            fs.setx(a, XATTR_DIR_LAYOUT_OBJECT_SIZE, "1048576"),
            Reply::Ok
        );
        assert_eq!(
            fs.setx(a, XATTR_DIR_LAYOUT_POOL, "nope"),
            Reply::Err(errno::EINVAL)
        );
        assert_eq!(
            fs.setx(a, XATTR_DIR_LAYOUT_OBJECT_SIZE, "1000"),
            Reply::Err(errno::EINVAL)
        );
        let f = fs.create(sub, "f");
        let i = fs.attr(f);
        assert_eq!((i.layout.pool, i.object_size), (Some(9), 1 << 20));
        assert_eq!(
            fs.getx(f, XATTR_FILE_LAYOUT_POOL),
            Reply::Xattr(b"ec".to_vec())
        );
        assert_eq!(
            fs.getx(a, XATTR_DIR_LAYOUT_POOL),
            Reply::Xattr(b"ec".to_vec())
        );
        assert_eq!(
            fs.getx(sub, XATTR_DIR_LAYOUT_POOL),
            Reply::Err(errno::ENODATA)
        );
        let g = fs.create(ROOT_INO, "g");
        assert_eq!(fs.attr(g).layout.pool, None);
        assert_eq!(
            fs.getx(g, XATTR_FILE_LAYOUT_POOL),
            Reply::Xattr(b"data".to_vec())
        );
        // an empty file's own layout may change (by id too); a written one's not
        assert_eq!(fs.setx(g, XATTR_FILE_LAYOUT_POOL, "9"), Reply::Ok);
        assert_eq!(fs.attr(g).layout.pool, Some(9));
        fs.written(g, 10);
        assert_eq!(
            fs.setx(g, XATTR_FILE_LAYOUT_POOL, "data"),
            Reply::Err(errno::ENOTEMPTY)
        );
        // moving a file keeps its layout; clearing the directory's affects new files only
        assert_eq!(fs.rename(sub, "f", ROOT_INO, "f"), Reply::Ok);
        assert_eq!(fs.attr(f).layout.pool, Some(9));
        let r = fs.run(Op::RemoveXattr {
            ino: a,
            name: XATTR_DIR_LAYOUT_POOL.into(),
        });
        assert_eq!(r, Reply::Ok);
        let h = fs.create(sub, "h");
        assert_eq!(
            (fs.attr(h).layout.pool, fs.attr(h).object_size),
            (None, 1 << 20)
        );
        // only root or the owner sets layouts
        let r = fs.run_as(
            USER,
            Op::SetXattr {
                ino: a,
                name: XATTR_DIR_LAYOUT_POOL.into(),
                value: b"ec".to_vec(),
                flags: 0,
            },
        );
        assert_eq!(r, Reply::Err(errno::EPERM));
    });
}

// ---- completed requests: idempotent retries ----

impl Fs {
    /// Runs `op` as request `tid` of client 7 (its oldest unanswered tid: `oldest`).
    fn run_req(&mut self, tid: u64, oldest: u64, op: &Op) -> Reply {
        self.run_req_full(tid, oldest, None, op, true)
    }

    /// As [`Fs::run_req`], with an inode-number hint; `journaled: false` drops the
    /// updates (answered early, then the MDS died before its journal held them).
    fn run_req_full(
        &mut self,
        tid: u64,
        oldest: u64,
        ino_hint: Option<Ino>,
        op: &Op,
        journaled: bool,
    ) -> Reply {
        let req = RequestId {
            client: 7,
            tid,
            oldest,
            ino_hint,
            delegated: false,
        };
        self.run_id(req, op, journaled)
    }

    /// Runs `op` as the request `req`.
    fn run_id(&mut self, req: RequestId, op: &Op, journaled: bool) -> Reply {
        for _ in 0..100 {
            match self
                .ns
                .apply_request(req, ROOT, op, Time { secs: 5, nanos: 0 })
            {
                Step::Done { reply, updates, .. } => {
                    if journaled {
                        self.store.apply(&updates);
                    }
                    if self.evict {
                        self.ns.mark_clean();
                        self.ns.evict_to(0);
                    }
                    return reply;
                }
                Step::Need(n) => self.load(n),
            }
        }
        panic!("op never completed: {op:?}");
    }

    /// Answers a [`Need`] from the store.
    fn load(&mut self, need: Need) {
        match need {
            Need::Inode(i) => {
                let inode = self.store.inodes.get(&i).cloned().expect("dangling");
                self.ns.insert_inode(inode);
            }
            Need::Dir(d) => {
                let entries = self.store.dirs.get(&d).cloned().unwrap_or_default();
                self.ns.insert_dir(d, entries);
            }
            Need::Probe(i) => self.probe(i),
            Need::Inline(i) => {
                let data = self.store.inline.get(&i).cloned();
                self.ns.insert_inline(i, data);
            }
        }
    }

    /// Answers a [`Need::Probe`] from the store.
    fn probe(&mut self, i: Ino) {
        match self.store.inodes.get(&i).cloned() {
            Some(inode) => self.ns.insert_inode(inode),
            None => self.ns.note_absent(i),
        }
    }

    /// A takeover as the daemon does it: allocation resumes [`REPLAY_INO_GAP`] past the
    /// journaled next inode number (stored), and the skipped range is a replay zone.
    fn failover_skipping(&mut self) {
        let next = self.store.next_ino;
        self.store.next_ino = next + REPLAY_INO_GAP;
        self.failover();
        self.ns.set_replay_zones(vec![next]);
    }

    /// The MDS died; a standby replayed the journal: an empty cache over the stored objects,
    /// with the next inode number and the completed requests the journal holds.
    fn failover(&mut self) {
        self.ns = Namespace::new(self.store.next_ino);
        self.ns.set_requests(self.store.requests.clone());
        self.ns
            .set_locks(crate::locks::LockTable::from_stored(&self.store.locks));
    }
}

fn mknod(parent: Ino, name: &str) -> Op {
    Op::Mknod {
        parent,
        name: name.into(),
        mode: S_IFREG | 0o600,
        rdev: 0,
        exclusive: true,
        open: false,
        write: false,
    }
}

#[test]
fn a_create_whose_reply_was_lost_is_answered_again_not_applied_twice() {
    both(|fs| {
        let d = fs.mkdir(ROOT_INO, "d");
        let op = mknod(d, "f");
        let first = match fs.run_req(10, 10, &op) {
            Reply::Attr(i) => i,
            r => panic!("{r:?}"),
        };
        // the reply is lost with the MDS; the client retries the same request on the new one
        fs.failover();
        match fs.run_req(10, 10, &op) {
            Reply::Attr(i) => assert_eq!(i.ino, first.ino, "the same file, not a new one"),
            r => panic!("a retried create must succeed, not {r:?}"),
        }
        assert_eq!(fs.names(d), vec!["f".to_string()]);
        // the same request on the same MDS (a retry after a timeout): the same answer
        assert!(matches!(fs.run_req(10, 10, &op), Reply::Attr(i) if i.ino == first.ino));
        // a new request for the same name is applied: O_EXCL says EEXIST
        assert_eq!(fs.run_req(11, 11, &op), Reply::Err(errno::EEXIST));
        assert_eq!(fs.names(d), vec!["f".to_string()]);
    });
}

#[test]
fn a_create_that_opens_registers_one_open_however_often_it_is_retried() {
    both(|fs| {
        let d = fs.mkdir(ROOT_INO, "d");
        let mut op = mknod(d, "f");
        if let Op::Mknod { open, write, .. } = &mut op {
            (*open, *write) = (true, true);
        }
        let f = match fs.run_req(10, 10, &op) {
            Reply::Attr(i) => i.ino,
            r => panic!("{r:?}"),
        };
        // retried after a timeout: answered from the table, still one open
        assert!(matches!(fs.run_req(10, 10, &op), Reply::Attr(i) if i.ino == f));
        // unlinked while open: kept as a stray until the one close
        let r = fs.run_req(
            11,
            11,
            &Op::Unlink {
                parent: d,
                name: "f".into(),
            },
        );
        assert_eq!(r, Reply::Ok);
        assert!(!fs.ns.purgeable().contains(&f), "purged while open");
        assert_eq!(
            fs.run_req(0, 0, &Op::CloseMany { inos: vec![f] }),
            Reply::Ok
        );
        assert!(
            fs.ns.purgeable().contains(&f),
            "still open after its one close"
        );
    });
}

#[test]
fn a_retried_unlink_succeeds_and_a_late_duplicate_removes_nothing_new() {
    both(|fs| {
        let d = fs.mkdir(ROOT_INO, "d");
        fs.create(d, "f");
        let unlink = Op::Unlink {
            parent: d,
            name: "f".into(),
        };
        assert_eq!(fs.run_req(20, 20, &unlink), Reply::Ok);
        fs.failover();
        assert_eq!(fs.run_req(20, 20, &unlink), Reply::Ok, "not ENOENT");
        // another thread of the same mount makes the file again while the unlink's answer is
        // still on its way (so the client's oldest unanswered tid is still 20): a late copy
        // of the unlink must not remove the new file
        let again = match fs.run_req(21, 20, &mknod(d, "f")) {
            Reply::Attr(i) => i.ino,
            r => panic!("{r:?}"),
        };
        assert_eq!(fs.run_req(20, 20, &unlink), Reply::Ok);
        assert_eq!(fs.ino(d, "f"), again);
        // without the table (a client that sends no tid), it would have been removed
        assert_eq!(fs.run_req(0, 0, &unlink), Reply::Ok);
        assert_eq!(fs.names(d), Vec::<String>::new());
    });
}

#[test]
fn a_retried_rename_succeeds_once() {
    both(|fs| {
        let a = fs.mkdir(ROOT_INO, "a");
        let b = fs.mkdir(ROOT_INO, "b");
        let f = fs.create(a, "f");
        let rename = Op::Rename {
            parent: a,
            name: "f".into(),
            new_parent: b,
            new_name: "g".into(),
            flags: 0,
        };
        assert_eq!(fs.run_req(30, 30, &rename), Reply::Ok);
        fs.failover();
        assert_eq!(fs.run_req(30, 30, &rename), Reply::Ok, "not ENOENT");
        assert_eq!(fs.names(a), Vec::<String>::new());
        assert_eq!(fs.names(b), vec!["g".to_string()]);
        assert_eq!(fs.ino(b, "g"), f);
        // another request is applied (and fails: the source is gone)
        assert_eq!(fs.run_req(31, 31, &rename), Reply::Err(errno::ENOENT));
    });
}

#[test]
fn failed_mutations_and_reads_are_not_recorded() {
    both(|fs| {
        let d = fs.mkdir(ROOT_INO, "d");
        let unlink = Op::Unlink {
            parent: d,
            name: "f".into(),
        };
        assert_eq!(fs.run_req(40, 40, &unlink), Reply::Err(errno::ENOENT));
        fs.create(d, "f");
        // the failure changed nothing: applying it again gives today's answer
        assert_eq!(fs.run_req(40, 40, &unlink), Reply::Ok);
        let look = Op::Lookup {
            parent: d,
            name: "g".into(),
        };
        assert_eq!(fs.run_req(41, 41, &look), Reply::Err(errno::ENOENT));
        assert_eq!(fs.store.requests.len(), 1);
    });
}

#[test]
fn the_table_forgets_below_the_oldest_unanswered_tid_and_old_records() {
    both(|fs| {
        let d = fs.mkdir(ROOT_INO, "d");
        for t in 1..=5u64 {
            fs.run_req(t, 1, &mknod(d, &format!("f{t}")));
        }
        assert_eq!(fs.store.requests.len(), 5);
        // the client has had every answer up to 4: only 5 and the new one stay
        fs.run_req(6, 5, &mknod(d, "f6"));
        assert_eq!(fs.store.requests.len(), 2);
        assert_eq!(fs.store.requests.get(7, 4), None);
        assert!(fs.store.requests.get(7, 5).is_some());
        // the namespace's own table agrees with the one the journal rebuilds
        assert_eq!(
            fs.ns.requests_snapshot(Time { secs: 5, nanos: 0 }),
            fs.store.requests
        );
        // records expire
        assert!(
            fs.ns
                .requests_snapshot(Time {
                    secs: 5 + requests::MAX_AGE_SECS + 1,
                    nanos: 0,
                })
                .is_empty()
        );
    });
}

#[test]
fn the_table_keeps_at_most_its_bound_per_client() {
    let mut t = requests::RequestTable::default();
    let at = Time::default();
    for tid in 1..=(requests::MAX_PER_CLIENT as u64 + 10) {
        t.record(9, tid, 0, Done::Ok, at);
    }
    assert_eq!(t.len(), requests::MAX_PER_CLIENT);
    assert_eq!(t.get(9, 1), None);
    assert_eq!(
        t.get(9, requests::MAX_PER_CLIENT as u64 + 10),
        Some(Done::Ok)
    );
    t.forget_below(9, u64::MAX);
    assert!(t.is_empty());
}

// directory fragments

fn small_fragments(fs: &mut Fs) {
    fs.ns.set_frag_config(frag::FragConfig {
        split_size: 20,
        split_bits: 2,
        merge_size: 50,
    });
}

fn readdir_page(fs: &mut Fs, dir: Ino, after: Option<String>, max: u32) -> (Vec<String>, bool) {
    match fs.run(Op::ReadDir {
        ino: dir,
        after,
        max,
    }) {
        Reply::Entries { entries, more } => (entries.into_iter().map(|(n, _)| n).collect(), more),
        r => panic!("readdir: {r:?}"),
    }
}

/// A directory that grows past the split size splits (journaled, with the inode recording
/// its fragment bits), keeps every entry through each split, and merges back once emptied.
#[test]
fn directories_split_into_fragments_and_keep_every_entry() {
    both(|fs| {
        small_fragments(fs);
        let d = fs.mkdir(ROOT_INO, "big");
        let mut splits = 0;
        for i in 0..300 {
            let before = fs.store.inodes[&d].frag_bits;
            fs.create(d, &format!("file-{i:03}"));
            let after = fs.store.inodes[&d].frag_bits;
            if after != before {
                splits += 1;
                assert!(after > before, "a split only grows the layout");
            }
        }
        assert!(splits >= 2, "300 entries, split size 20: {splits} splits");
        let bits = fs.attr(d).frag_bits;
        assert!(bits >= 4, "bits {bits}");
        let names = fs.names(d);
        assert_eq!(names.len(), 300);
        assert!(names.windows(2).all(|w| w[0] < w[1]));
        // every split was journaled as such, with the inode's new layout
        let journaled: Vec<(u8, u8)> = fs
            .store
            .journal
            .iter()
            .filter_map(|u| match u {
                Update::Fragment { dir, from, to } if *dir == d => Some((*from, *to)),
                _ => None,
            })
            .collect();
        assert_eq!(journaled.len(), splits);
        assert_eq!(journaled.last().map(|j| j.1), Some(bits));
        // the objects the checkpoint writes hold every entry, each in its fragment
        let plans = frag::plan_dirs(&fs.store.journal);
        let plan = &plans[&d];
        assert_eq!(plan.bits, bits);
        let stored: usize = plan.writes(d).iter().map(|w| w.puts.len()).sum();
        assert_eq!(stored, 300);
        // emptied, it goes back to one object
        for i in 0..300 {
            assert_eq!(
                fs.run(Op::Unlink {
                    parent: d,
                    name: format!("file-{i:03}"),
                }),
                Reply::Ok
            );
        }
        assert_eq!(fs.attr(d).frag_bits, 0);
        assert_eq!(
            fs.run(Op::Rmdir {
                parent: ROOT_INO,
                name: "big".into()
            }),
            Reply::Ok
        );
    });
}

/// `readdir` continues from its cookie (the last name returned) across a split between two
/// calls: every entry that was there throughout is returned exactly once, in order.
#[test]
fn readdir_across_a_split_neither_skips_nor_repeats() {
    both(|fs| {
        small_fragments(fs);
        let d = fs.mkdir(ROOT_INO, "d");
        let first: Vec<String> = (0..18).map(|i| format!("a{i:02}")).collect();
        for n in &first {
            fs.create(d, n);
        }
        assert_eq!(fs.attr(d).frag_bits, 0);
        let (mut seen, more) = readdir_page(fs, d, None, 7);
        assert!(more);
        // the directory splits (twice) between two calls
        for i in 0..120 {
            fs.create(d, &format!("b{i:03}"));
        }
        assert!(fs.attr(d).frag_bits >= 4);
        loop {
            let (page, more) = readdir_page(fs, d, seen.last().cloned(), 7);
            seen.extend(page);
            if !more {
                break;
            }
        }
        assert!(
            seen.windows(2).all(|w| w[0] < w[1]),
            "order or repeats: {seen:?}"
        );
        for n in &first {
            assert_eq!(seen.iter().filter(|s| *s == n).count(), 1, "{n}");
        }
        assert_eq!(seen.len(), 138);
    });
}

// locks across a restart

/// Lock changes are journaled, so the namespace a standby rebuilds from the journal holds the
/// same locks: another client is still refused until the holder releases, a reconnect keeps
/// the locks, and a client that went away loses them (journaled too).
#[test]
fn locks_are_journaled_and_survive_a_failover() {
    use crate::locks::{F_RDLCK, F_WRLCK, Lock};
    let mut fs = Fs::new(true);
    let f = fs.create(ROOT_INO, "f");
    let mine = Lock {
        owner: 1,
        start: 0,
        end: u64::MAX,
        typ: F_WRLCK,
        pid: 1,
    };
    let theirs = Lock {
        owner: 2,
        start: 5,
        end: 5,
        typ: F_RDLCK,
        pid: 2,
    };
    let other = |fs: &mut Fs| match fs.ns.apply(
        8,
        ROOT,
        &Op::SetLk {
            ino: f,
            lock: theirs,
        },
        Time::default(),
    ) {
        Step::Done { reply, updates, .. } => {
            fs.store.apply(&updates);
            reply
        }
        s => panic!("{s:?}"),
    };
    assert_eq!(fs.run(Op::SetLk { ino: f, lock: mine }), Reply::Ok);
    assert!(fs.store.journal.iter().any(
        |u| matches!(u, Update::Locks { ino, held } if *ino == f && held == &vec![(7, mine)])
    ));
    fs.failover();
    assert_eq!(other(&mut fs), Reply::Err(errno::EAGAIN));
    // the holder reconnects to the new MDS: its locks stay
    assert_eq!(fs.run(Op::Reconnect { opens: Vec::new() }), Reply::Ok);
    assert_eq!(other(&mut fs), Reply::Err(errno::EAGAIN));
    // an unlock that changes nothing journals nothing
    let before = fs.store.journal.len();
    assert_eq!(fs.run(Op::ReleaseLocks { ino: f, owner: 99 }), Reply::Ok);
    assert_eq!(fs.store.journal.len(), before);
    assert_eq!(fs.run(Op::ReleaseLocks { ino: f, owner: 1 }), Reply::Ok);
    fs.failover();
    assert_eq!(other(&mut fs), Reply::Ok);
    fs.failover();
    assert_eq!(
        fs.run(Op::SetLk { ino: f, lock: mine }),
        Reply::Err(errno::EAGAIN),
        "client 8's read lock came through the failover"
    );
    // client 8 went away: its locks go, and stay gone after a failover
    let updates = fs.ns.drop_locks_of(8);
    fs.store.apply(&updates);
    fs.failover();
    assert_eq!(fs.run(Op::SetLk { ino: f, lock: mine }), Reply::Ok);
}

// ---- early replies: creates sent again after a takeover ----

#[test]
fn a_create_answered_early_and_lost_with_the_mds_is_made_again_with_its_inode_number() {
    both(|fs| {
        let d = fs.mkdir(ROOT_INO, "d");
        fs.failover_skipping();
        // answered early; the MDS dies before its journal holds the create
        let lost = match fs.run_req_full(10, 10, None, &mknod(d, "f"), false) {
            Reply::Attr(i) => i.ino,
            r => panic!("{r:?}"),
        };
        fs.failover_skipping();
        assert!(fs.names(d).is_empty(), "the create was lost with the MDS");
        // another client creates meanwhile: never the number the lost create was given
        let other = fs.create(d, "g");
        assert_ne!(other, lost);
        // the client sends its create again with that number: it gets it back
        match fs.run_req_full(10, 10, Some(lost), &mknod(d, "f"), true) {
            Reply::Attr(i) => assert_eq!(i.ino, lost, "the kernel's inode number is kept"),
            r => panic!("{r:?}"),
        }
        assert_eq!(fs.ino(d, "f"), lost);
        // a hint of an inode that exists, or outside the skipped ranges, gets a new number
        for (tid, hint, name) in [(11, lost, "h"), (12, other, "k"), (13, 3, "m")] {
            match fs.run_req_full(tid, tid, Some(hint), &mknod(d, name), true) {
                Reply::Attr(i) => {
                    assert_ne!(i.ino, hint, "{name} took inode {hint}");
                    assert_ne!(i.ino, lost);
                }
                r => panic!("{r:?}"),
            }
        }
        assert_eq!(fs.attr(lost).ino, lost);
    });
}

// ---- creates without a round trip: delegated inode numbers ----

#[test]
fn a_create_sent_behind_gets_the_number_its_client_gave_or_is_refused() {
    both(|fs| {
        let d = fs.mkdir(ROOT_INO, "d");
        let behind = |fs: &mut Fs, tid: u64, hint: Ino, op: &Op| {
            let req = RequestId {
                client: 7,
                tid,
                // (the first create stays unanswered: its retry is answered from the table)
                oldest: 20,
                ino_hint: Some(hint),
                delegated: true,
            };
            fs.run_id(req, op, true)
        };
        let range = fs.ns.delegate(7);
        assert_eq!(range.end - range.start, DELEGATION_SIZE);
        // nothing else is ever given a number of the range
        let other = fs.create(d, "other");
        assert!(!(range.start..range.end).contains(&other));
        let first = range.start + 5;
        match behind(fs, 20, first, &mknod(d, "a")) {
            Reply::Attr(i) => assert_eq!(i.ino, first),
            r => panic!("{r:?}"),
        }
        assert_eq!(fs.ino(d, "a"), first);
        // the same number twice, a number outside every range, a create that may open an
        // existing file: refused, never given another number
        for (tid, hint, op) in [
            (21, first, mknod(d, "b")),
            (22, other, mknod(d, "c")),
            (23, 3, mknod(d, "e")),
            (
                24,
                first + 1,
                Op::Mknod {
                    parent: d,
                    name: "g".into(),
                    mode: S_IFREG | 0o600,
                    rdev: 0,
                    exclusive: false,
                    open: false,
                    write: false,
                },
            ),
        ] {
            assert_eq!(
                behind(fs, tid, hint, &op),
                Reply::Err(errno::ESTALE),
                "{op:?}"
            );
        }
        assert_eq!(fs.names(d), vec!["a".to_string(), "other".to_string()]);
        // sent again (the reply was lost): answered from the completed-request table
        match behind(fs, 20, first, &mknod(d, "a")) {
            Reply::Attr(i) => assert_eq!(i.ino, first),
            r => panic!("{r:?}"),
        }
        // a takeover: the stored ranges come back; a number is given after a probe finds it
        // unused, and one an inode has is refused
        let stored = fs.ns.delegations().to_vec();
        fs.failover();
        fs.ns.set_delegations(stored);
        match behind(fs, 30, first + 1, &mknod(d, "h")) {
            Reply::Attr(i) => assert_eq!(i.ino, first + 1),
            r => panic!("{r:?}"),
        }
        assert_eq!(
            behind(fs, 31, first, &mknod(d, "k")),
            Reply::Err(errno::ESTALE)
        );
        // and nothing is allocated inside a stored range
        let after = fs.create(d, "after");
        assert!(after >= range.end, "{after} inside {range:?}");
    });
}

#[test]
fn delegated_ranges_are_bounded_per_client_and_in_all() {
    let mut ns = Namespace::new(FIRST_INO);
    let a: Vec<Delegation> = (0..3).map(|_| ns.delegate(1)).collect();
    assert_eq!(ns.delegations(), &a[1..], "a client keeps its newest two");
    for c in 0..(crate::core::delegate::DELEGATIONS_KEPT as u64 + 10) {
        ns.delegate(100 + c);
    }
    assert_eq!(
        ns.delegations().len(),
        crate::core::delegate::DELEGATIONS_KEPT
    );
    assert!(ns.delegations().iter().all(|d| d.client != 1));
}

#[test]
fn only_a_directory_without_quota_or_layout_above_lets_its_maker_create_alone() {
    // (the MDS asks right after the mkdir, with the directory's ancestors in its cache)
    let fs = &mut Fs::new(false);
    {
        let plain = fs.mkdir(ROOT_INO, "plain");
        let inner = fs.mkdir(plain, "inner");
        assert!(fs.ns.creates_delegable(plain) && fs.ns.creates_delegable(inner));
        let q = fs.mkdir(ROOT_INO, "q");
        let qi = fs.mkdir(q, "inner");
        assert_eq!(
            fs.run(Op::SetXattr {
                ino: q,
                name: XATTR_QUOTA_MAX_FILES.into(),
                value: b"100".to_vec(),
                flags: 0,
            }),
            Reply::Ok
        );
        let l = fs.mkdir(ROOT_INO, "l");
        let li = fs.mkdir(l, "inner");
        assert_eq!(
            fs.run(Op::SetXattr {
                ino: l,
                name: XATTR_DIR_LAYOUT_OBJECT_SIZE.into(),
                value: b"1048576".to_vec(),
                flags: 0,
            }),
            Reply::Ok
        );
        for d in [q, qi, l, li] {
            let _ = fs.attr(d);
            assert!(!fs.ns.creates_delegable(d), "{d}");
        }
        assert!(fs.ns.creates_delegable(plain));
    }
}

// ---- inline data ----

impl Fs {
    fn written_inline(&mut self, ino: Ino, end: u64, data: &[u8]) -> Reply {
        self.run(Op::WrittenInline {
            ino,
            end,
            mtime: Time { secs: 6, nanos: 0 },
            renew: false,
            ctime: None,
            set: None,
            data: InlineData(bytes::Bytes::copy_from_slice(data)),
        })
    }

    fn inline_of(&mut self, ino: Ino) -> Reply {
        self.run(Op::ReadInline { ino })
    }

    fn cut(&mut self, ino: Ino, size: u64) -> Reply {
        self.run(Op::SetAttr {
            ino,
            set: SetAttr {
                size: Some(size),
                ..SetAttr::default()
            },
        })
    }
}

fn inline(data: &'static [u8]) -> Reply {
    Reply::Inline(InlineData(bytes::Bytes::from_static(data)))
}

#[test]
fn inline_data_is_kept_read_cut_moved_out_and_purged() {
    both(|fs| {
        let a = fs.mkdir(ROOT_INO, "a");
        let f = fs.create(a, "f");
        // an empty file takes inline data; the size is the end written
        let Reply::Attr(i) = fs.written_inline(f, 10, b"0123456789") else {
            panic!("refused")
        };
        assert!(i.inline);
        assert_eq!(i.size, 10);
        assert_eq!(fs.stat(a), (10, 1));
        assert_eq!(fs.inline_of(f), inline(b"0123456789"));
        // its writer sends it again, grown
        fs.written_inline(f, 12, b"0123456789ab");
        assert_eq!(fs.attr(f).size, 12);
        // a plain write past the end of an inline file is refused (the data must move out
        // first), one inside it is not
        assert_eq!(fs.written(f, 100), Reply::Err(errno::EINVAL));
        assert!(matches!(fs.written(f, 12), Reply::Attr(_)));
        // a truncate cuts the data with the file; extending leaves zeros after it
        fs.cut(f, 4);
        assert_eq!(fs.inline_of(f), inline(b"0123"));
        fs.cut(f, 50);
        assert_eq!(fs.attr(f).size, 50);
        assert!(fs.attr(f).inline);
        assert_eq!(fs.inline_of(f), inline(b"0123"));
        // moved out: no longer inline, nothing stored
        let Reply::Attr(i) = fs.run(Op::Uninline { ino: f }) else {
            panic!()
        };
        assert!(!i.inline);
        assert_eq!(i.size, 50);
        assert_eq!(fs.inline_of(f), Reply::Err(errno::ENODATA));
        assert!(!fs.store.inline.contains_key(&f));
        // a file with data (not inline, not empty) refuses inline data
        assert_eq!(fs.written_inline(f, 3, b"abc"), Reply::Err(errno::EINVAL));
        // more inline data than the end written is refused too
        let g = fs.create(a, "g");
        assert_eq!(fs.written_inline(g, 2, b"abc"), Reply::Err(errno::EINVAL));
        // cut to nothing: no longer inline
        fs.written_inline(g, 3, b"abc");
        assert_eq!(fs.store.inline.get(&g).map(|d| &d[..]), Some(&b"abc"[..]));
        fs.cut(g, 0);
        assert!(!fs.attr(g).inline);
        assert!(!fs.store.inline.contains_key(&g));
        // unlinked: a stray, purged with its inline data
        let h = fs.create(a, "h");
        fs.written_inline(h, 5, b"hello");
        let gone = fs.run(Op::Unlink {
            parent: a,
            name: "h".into(),
        });
        assert_eq!(gone, Reply::Ok);
        assert!(fs.store.inline.contains_key(&h));
        let inline = fs.attr(h).inline;
        let upd = fs.ns.purged(h, inline);
        fs.store.apply(&upd);
        assert!(!fs.store.inline.contains_key(&h));
    });
}
