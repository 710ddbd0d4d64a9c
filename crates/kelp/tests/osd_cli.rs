//! `kelp osd run` settings from the command line and from `kelp.conf`'s `[osd]` section: bad
//! values are refused with a message naming the setting, before anything is mounted.
#![allow(clippy::unwrap_used)] // test code: a failed unwrap is a failed test

use std::path::PathBuf;
use std::process::{Command, Output};

struct TempDir(PathBuf);

impl TempDir {
    fn new(tag: &str) -> Self {
        let p = std::env::temp_dir().join(format!("kelp-osd-cli-{tag}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&p);
        std::fs::create_dir_all(&p).unwrap();
        TempDir(p)
    }

    /// A `kelp.conf` with `osd_section` appended, and an empty keyring beside it.
    fn conf(&self, osd_section: &str) -> PathBuf {
        std::fs::write(
            self.0.join("keyring"),
            "# kelp keyring: entity base64secret\n",
        )
        .unwrap();
        let conf = self.0.join("kelp.conf");
        std::fs::write(
            &conf,
            format!(
                "[global]\nfsid = \"f\"\nmon_host = [\"127.0.0.1:9\"]\nkeyring = \"keyring\"\n\
                 {osd_section}"
            ),
        )
        .unwrap();
        conf
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

fn osd_run(conf: &std::path::Path, data: &std::path::Path, extra: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_kelp"))
        .args(["osd", "run", "--id", "0", "--data"])
        .arg(data)
        .arg("-c")
        .arg(conf)
        .args(extra)
        .output()
        .expect("run kelp")
}

fn refused_with(o: &Output, needles: &[&str]) {
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(
        !o.status.success(),
        "expected a refusal, got success: {err}"
    );
    for n in needles {
        assert!(err.contains(n), "stderr lacks {n:?}: {err}");
    }
}

#[test]
fn a_cache_size_in_the_osd_section_that_is_not_a_size_is_refused() {
    let d = TempDir::new("cache");
    let conf = d.conf("[osd]\ncache = \"lots\"\n");
    let o = osd_run(&conf, &d.0.join("no-store"), &[]);
    refused_with(&o, &["[osd] cache", "lots"]);
}

#[test]
fn unknown_keys_in_the_osd_section_are_refused() {
    let d = TempDir::new("unknown");
    let conf = d.conf("[osd]\nthread = 2\n");
    let o = osd_run(&conf, &d.0.join("no-store"), &[]);
    refused_with(&o, &["thread"]);
}

#[test]
fn zero_worker_threads_are_refused() {
    let d = TempDir::new("threads");
    let conf = d.conf("[osd]\nthreads = 0\n");
    refused_with(
        &osd_run(&conf, &d.0.join("no-store"), &[]),
        &["at least one worker thread"],
    );
    // The command line overrides the file: a valid --threads gets past the check and fails
    // only at the (missing) store.
    let o = osd_run(&conf, &d.0.join("no-store"), &["--threads", "1"]);
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(!o.status.success());
    assert!(!err.contains("worker thread"), "{err}");
}
