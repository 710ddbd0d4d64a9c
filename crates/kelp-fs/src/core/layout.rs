//! File layouts: which data pool a new file's objects go to, and how big they are.
//!
//! A directory may carry a layout (`kelp.dir.layout.*`); a new regular file takes, field by
//! field, the layout of the nearest directory above it that sets one (so a layout set on a
//! directory also applies below its existing subdirectories), and keeps it for good: moving the
//! file or changing the directory's layout later does not move its data. A file's own layout
//! (`kelp.file.layout.*`) may be changed only while it is empty.

use super::*;

impl Namespace {
    /// The layout a new regular file below `chain` (a directory and those above it, loaded)
    /// takes.
    pub(super) fn inherited_layout(&self, chain: &[Ino]) -> Layout {
        let mut out = Layout::default();
        for d in chain {
            let Some(l) = self.inodes.get(d).map(|i| i.layout) else {
                continue;
            };
            out.pool = out.pool.or(l.pool);
            out.object_size = out.object_size.or(l.object_size);
        }
        out
    }

    fn pool_named(&self, value: &[u8]) -> R<u32> {
        let name = std::str::from_utf8(value).map_err(|_| Stop::Err(errno::EINVAL))?;
        let name = name.trim_end_matches(['\n', '\0']).trim();
        if let Some(id) = self.data_pools.get(name) {
            return Ok(*id);
        }
        // a pool id is accepted too, as CephFS does
        match name.parse::<u32>() {
            Ok(id) if self.data_pools.values().any(|p| *p == id) => Ok(id),
            _ => Err(Stop::Err(errno::EINVAL)),
        }
    }

    fn pool_name(&self, id: Option<u32>) -> String {
        let id = id.or(self.default_pool);
        self.data_pools
            .iter()
            .find(|(_, p)| Some(**p) == id)
            .map(|(n, _)| n.clone())
            .unwrap_or_else(|| id.map(|i| i.to_string()).unwrap_or_default())
    }

    /// `setxattr`/`removexattr` (`value` None) of a `kelp.*.layout.*` attribute.
    pub(super) fn set_layout_xattr(
        &mut self,
        caller: Caller,
        mut i: Inode,
        name: &str,
        value: Option<&[u8]>,
    ) -> R<Inode> {
        if caller.uid != 0 && caller.uid != i.uid {
            return Err(Stop::Err(errno::EPERM));
        }
        let object_size = |v: &[u8]| -> R<u64> {
            let text = std::str::from_utf8(v).map_err(|_| Stop::Err(errno::EINVAL))?;
            let n: u64 = text
                .trim_end_matches(['\n', '\0'])
                .trim()
                .parse()
                .map_err(|_| Stop::Err(errno::EINVAL))?;
            if !(MIN_OBJECT_SIZE..=MAX_OBJECT_SIZE).contains(&n) || !n.is_multiple_of(4096) {
                return Err(Stop::Err(errno::EINVAL));
            }
            Ok(n)
        };
        match name {
            XATTR_DIR_LAYOUT_POOL | XATTR_DIR_LAYOUT_OBJECT_SIZE => {
                if !i.is_dir() {
                    return Err(Stop::Err(errno::EINVAL));
                }
                if name == XATTR_DIR_LAYOUT_POOL {
                    i.layout.pool = value.map(|v| self.pool_named(v)).transpose()?;
                } else {
                    i.layout.object_size = value.map(object_size).transpose()?;
                }
            }
            XATTR_FILE_LAYOUT_POOL | XATTR_FILE_LAYOUT_OBJECT_SIZE => {
                if i.kind() != S_IFREG {
                    return Err(Stop::Err(errno::EINVAL));
                }
                // the data would have to move: only an empty file's layout changes
                if i.size != 0 {
                    return Err(Stop::Err(errno::ENOTEMPTY));
                }
                let v = value.ok_or(Stop::Err(errno::EINVAL))?;
                if name == XATTR_FILE_LAYOUT_POOL {
                    i.layout.pool = Some(self.pool_named(v)?);
                } else {
                    i.object_size = object_size(v)?;
                }
            }
            _ => return Err(Stop::Err(errno::EOPNOTSUPP)),
        }
        Ok(i)
    }

    /// `getxattr` of a `kelp.*.layout.*` attribute.
    pub(super) fn get_layout_xattr(&self, i: &Inode, name: &str) -> R<Vec<u8>> {
        let v = match name {
            XATTR_DIR_LAYOUT_POOL if i.is_dir() => i.layout.pool.map(|p| self.pool_name(Some(p))),
            XATTR_DIR_LAYOUT_OBJECT_SIZE if i.is_dir() => {
                i.layout.object_size.map(|n| n.to_string())
            }
            XATTR_FILE_LAYOUT_POOL if i.kind() == S_IFREG => Some(self.pool_name(i.layout.pool)),
            XATTR_FILE_LAYOUT_OBJECT_SIZE if i.kind() == S_IFREG => Some(i.object_size.to_string()),
            _ => None,
        };
        v.map(String::into_bytes).ok_or(Stop::Err(errno::ENODATA))
    }
}
