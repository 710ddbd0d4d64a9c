//! Recursive directory statistics and quotas (and the dispatch of every virtual `kelp.`
//! attribute: layouts are in `layout.rs`).
//!
//! Every directory keeps, in its inode's [`DirStat`], the bytes of the regular files and the
//! number of entries below it. A change below a directory adds its delta to each directory on
//! the way up to the root; before that, a growth is checked against every quota on the way
//! (EDQUOT). Regular files count under their primary link only (`Inode::parent`), so a hard
//! link is counted once.
//!
//! Statistics changes are journaled like any other, but they do not invalidate what clients
//! cache of a directory: nothing `stat` shows changes with them.

use super::*;

/// Net changes to the statistics of directories: (bytes, entries) per directory.
#[derive(Debug, Default)]
pub(super) struct Acct(BTreeMap<Ino, (i64, i64)>);

impl Acct {
    /// Adds `w` to every directory of `chain`.
    pub(super) fn add(&mut self, chain: &[Ino], w: (i64, i64)) {
        if w == (0, 0) {
            return;
        }
        for d in chain {
            let e = self.0.entry(*d).or_default();
            e.0 += w.0;
            e.1 += w.1;
        }
    }
}

/// What an inode adds to the directories above it: (bytes, entries).
pub(super) fn weight(i: &Inode) -> (i64, i64) {
    let sat = |v: u64| i64::try_from(v).unwrap_or(i64::MAX);
    if i.is_dir() {
        (
            sat(i.dirstat.rbytes),
            sat(i.dirstat.rentries).saturating_add(1),
        )
    } else if i.kind() == S_IFREG {
        (sat(i.size), 1)
    } else {
        (0, 1)
    }
}

/// The directory whose statistics `i` counts in, if any.
pub(super) fn home(i: &Inode) -> Option<Ino> {
    (i.parent != 0).then_some(i.parent)
}

fn parse_quota(value: &[u8]) -> Option<u64> {
    let text = std::str::from_utf8(value).ok()?;
    text.trim_end_matches(['\n', '\0']).trim().parse().ok()
}

impl Namespace {
    /// Whether a byte quota (`kelp.quota.max_bytes`) is set on a directory above the file
    /// `ino` (`None`: not all of them are loaded). A client may defer the size updates of a
    /// file (the exclusive capability) only where none is: the MDS checks every growth
    /// against quotas when it learns of it, so a deferred one could pass a quota unseen.
    pub fn byte_quota_above(&self, ino: Ino) -> Option<bool> {
        let i = self.inodes.get(&ino)?;
        let mut d = home(i)?;
        for _ in 0..4096 {
            let dir = self.inodes.get(&d)?;
            if !dir.is_dir() || dir.nlink == 0 {
                return Some(false);
            }
            if dir.dirstat.max_bytes > 0 {
                return Some(true);
            }
            if d == ROOT_INO {
                return Some(false);
            }
            d = dir.parent;
        }
        None
    }

    /// `dir` and every directory above it up to the root, all loaded. A directory that is no
    /// longer linked ends the chain (nothing above it counts it).
    pub(super) fn ancestors(&self, dir: Ino) -> R<Vec<Ino>> {
        let mut out = Vec::new();
        let mut d = dir;
        for _ in 0..4096 {
            if d == 0 {
                return Ok(out);
            }
            let i = self.inode(d)?;
            if !i.is_dir() || i.nlink == 0 {
                return Ok(out);
            }
            out.push(d);
            if d == ROOT_INO {
                return Ok(out);
            }
            d = i.parent;
        }
        Err(Stop::Err(errno::EIO))
    }

    /// EDQUOT if a net growth in `acct` would take a directory past its quota. Every
    /// directory in `acct` must be loaded (it came from [`Namespace::ancestors`]).
    pub(super) fn check_quota(&self, acct: &Acct) -> R<()> {
        for (d, (bytes, entries)) in &acct.0 {
            let Some(s) = self.inodes.get(d).map(|i| i.dirstat) else {
                continue;
            };
            let over = |used: u64, delta: i64, max: u64| {
                max > 0 && delta > 0 && used.saturating_add(delta.unsigned_abs()) > max
            };
            if over(s.rbytes, *bytes, s.max_bytes) || over(s.rentries, *entries, s.max_files) {
                return Err(Stop::Err(errno::EDQUOT));
            }
        }
        Ok(())
    }

    /// Applies `acct` to the cached directories and journals them (after every other change
    /// of the operation, so that nothing writes an older copy over them).
    pub(super) fn commit_acct(&mut self, acct: Acct, upd: &mut Vec<Update>) {
        for (d, (bytes, entries)) in acct.0 {
            if (bytes, entries) == (0, 0) {
                continue;
            }
            let Some(i) = self.inodes.get_mut(&d) else {
                continue;
            };
            i.dirstat.rbytes = i.dirstat.rbytes.saturating_add_signed(bytes);
            i.dirstat.rentries = i.dirstat.rentries.saturating_add_signed(entries);
            upd.push(Update::PutInode(i.clone()));
        }
    }

    /// `setxattr` (`value` None: `removexattr`) of a virtual `kelp.` attribute (`None`: not one
    /// of them).
    #[allow(clippy::too_many_arguments)]
    pub(super) fn set_virtual_xattr(
        &mut self,
        caller: Caller,
        ino: Ino,
        name: &str,
        value: Option<&[u8]>,
        now: Time,
        upd: &mut Vec<Update>,
        inval: &mut Invalidate,
    ) -> Option<R<Reply>> {
        if !name.starts_with("kelp.") {
            return None;
        }
        Some((|| {
            let mut i = self.inode(ino)?.clone();
            if name.contains(".layout.") {
                let mut i = self.set_layout_xattr(caller, i, name, value)?;
                i.ctime = now;
                self.put(i, upd, inval);
                return Ok(Reply::Ok);
            }
            if name != XATTR_QUOTA_MAX_BYTES && name != XATTR_QUOTA_MAX_FILES {
                // the statistics are read-only; other names are reserved
                return Err(Stop::Err(if name.starts_with("kelp.dir.") {
                    errno::EPERM
                } else {
                    errno::EOPNOTSUPP
                }));
            }
            if !i.is_dir() {
                return Err(Stop::Err(errno::EINVAL));
            }
            if caller.uid != 0 {
                return Err(Stop::Err(errno::EPERM));
            }
            let v = match value {
                Some(v) => parse_quota(v).ok_or(Stop::Err(errno::EINVAL))?,
                None => 0,
            };
            if name == XATTR_QUOTA_MAX_BYTES {
                i.dirstat.max_bytes = v;
            } else {
                i.dirstat.max_files = v;
            }
            i.ctime = now;
            self.put(i, upd, inval);
            Ok(Reply::Ok)
        })())
    }

    /// `getxattr` of a virtual `kelp.` attribute (`None`: not one of them).
    pub(super) fn get_virtual_xattr(&self, ino: Ino, name: &str) -> Option<R<Reply>> {
        if !name.starts_with("kelp.") {
            return None;
        }
        Some((|| {
            let i = self.inode(ino)?;
            if name.contains(".layout.") {
                return self.get_layout_xattr(i, name).map(Reply::Xattr);
            }
            if !i.is_dir() {
                return Err(Stop::Err(errno::ENODATA));
            }
            let s = i.dirstat;
            let v = match name {
                XATTR_QUOTA_MAX_BYTES if s.max_bytes > 0 => s.max_bytes,
                XATTR_QUOTA_MAX_FILES if s.max_files > 0 => s.max_files,
                XATTR_DIR_RBYTES => s.rbytes,
                XATTR_DIR_RENTRIES => s.rentries,
                _ => return Err(Stop::Err(errno::ENODATA)),
            };
            Ok(Reply::Xattr(v.to_string().into_bytes()))
        })())
    }
}
