//! The device class an OSD reports at boot (`nvme`, `ssd`, `hdd`), read from the block device
//! that holds its data directory, so that CRUSH rules can place pools by class without the
//! operator naming every OSD (Ceph's `osd_class_update_on_start`).
//!
//! The kernel says it: `/sys/dev/block/MAJOR:MINOR` is the device (a partition's parent is
//! the disk), its `queue/rotational` is 1 for spinning media, and NVMe namespaces are named
//! `nvme…`. A data directory on a virtual file system (tmpfs, overlay: no block device) has
//! no class. The decision itself is [`class_of`], a pure function.

use std::path::{Path, PathBuf};

/// The class of a disk named `disk` whose `queue/rotational` reads `rotational`.
pub fn class_of(disk: &str, rotational: Option<bool>) -> Option<&'static str> {
    if disk.starts_with("nvme") {
        return Some("nvme");
    }
    match rotational {
        Some(false) => Some("ssd"),
        Some(true) => Some("hdd"),
        None => None,
    }
}

/// Linux's split of a `dev_t` into major and minor numbers (glibc's `gnu_dev_major/minor`).
fn major_minor(dev: u64) -> (u64, u64) {
    let major = ((dev >> 8) & 0xfff) | ((dev >> 32) & !0xfff);
    let minor = (dev & 0xff) | ((dev >> 12) & !0xff);
    (major, minor)
}

/// The class of the device under `data`, or `None` when it cannot be told.
pub fn detect(data: &Path) -> Option<&'static str> {
    use std::os::unix::fs::MetadataExt;
    let dev = std::fs::metadata(data).ok()?.dev();
    let (major, minor) = major_minor(dev);
    if major == 0 {
        return None;
    }
    let sys: PathBuf = std::fs::canonicalize(format!("/sys/dev/block/{major}:{minor}")).ok()?;
    // a partition has no queue of its own: its disk is the parent directory
    let disk = if sys.join("queue").exists() {
        sys
    } else {
        sys.parent()?.to_path_buf()
    };
    let name = disk.file_name()?.to_str()?.to_string();
    let rotational = std::fs::read_to_string(disk.join("queue/rotational"))
        .ok()
        .and_then(|s| match s.trim() {
            "0" => Some(false),
            "1" => Some(true),
            _ => None,
        });
    class_of(&name, rotational)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn classes_from_name_and_rotational() {
        assert_eq!(class_of("nvme0n1", Some(false)), Some("nvme"));
        assert_eq!(class_of("nvme1n2", None), Some("nvme"));
        assert_eq!(class_of("sda", Some(false)), Some("ssd"));
        assert_eq!(class_of("sdb", Some(true)), Some("hdd"));
        assert_eq!(class_of("dm-0", Some(true)), Some("hdd"));
        assert_eq!(class_of("vda", None), None);
    }

    #[test]
    fn dev_numbers_split_as_glibc_does() {
        assert_eq!(major_minor(0x0801), (8, 1));
        assert_eq!(major_minor(0x10300), (259, 0));
        // large minors spill into the high bits
        assert_eq!(major_minor((1 << 20) | (8 << 8) | 5), (8, 256 + 5));
    }

    #[test]
    fn a_directory_on_a_virtual_file_system_has_no_class() {
        // /proc is never on a block device
        assert_eq!(detect(Path::new("/proc")), None);
    }
}
