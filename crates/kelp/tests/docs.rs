//! The newcomer's guide cannot rot: `docs/GETTING-STARTED.md` is run as written.
//!
//! * `getting_started_runs_as_written` extracts the guide's fenced ```` ```bash ```` blocks in
//!   order (blocks fenced ```` ```console ```` or ```` ```text ```` show output and are not run,
//!   and a bash block whose first line is [`NOT_RUN`] is skipped: the build-and-install step)
//!   and runs them as one `bash -euo pipefail` script in a fresh temporary directory, with this
//!   build's `kelp` first on `PATH`. Any failing command fails the test; the run is killed and
//!   failed after [`TIMEOUT`]; the cluster the guide starts is always stopped (a drop guard
//!   runs `kelp down`). The guide talks to S3 with the aws CLI and boto3, which must be
//!   installed (`.ci/run` installs them).
//! * `documented_kelp_commands_exist` finds every `kelp …` command line in README.md and the
//!   guide (bash blocks and inline code) and runs `kelp <subcommand path> --help` for each
//!   distinct subcommand path, checking that every option written there is one the command
//!   knows: a renamed command or option fails here before a reader trips over it.

use std::collections::{BTreeMap, BTreeSet};
use std::io::Read;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// First line of a bash block the docs test does not run (building and installing `kelp`:
/// the test runs the binary cargo just built).
const NOT_RUN: &str = "# not run by the docs test";
/// The whole guide, cluster creation included, must finish within this.
const TIMEOUT: Duration = Duration::from_secs(6 * 60);
const GUIDE: &str = "docs/GETTING-STARTED.md";

fn repo_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

fn kelp_bin() -> PathBuf {
    PathBuf::from(env!("CARGO_BIN_EXE_kelp"))
}

fn read_doc(rel: &str) -> String {
    std::fs::read_to_string(repo_root().join(rel)).unwrap_or_else(|e| panic!("reading {rel}: {e}"))
}

/// A fenced code block: its info string (`bash`, `console`, ...), the line it starts on, its body.
struct Block {
    info: String,
    line: usize,
    body: String,
}

/// The fenced blocks of a Markdown text, in order. Fences are lines starting with three
/// backticks (indentation allowed); a block ends at the next bare fence.
fn fenced_blocks(md: &str) -> Vec<Block> {
    let mut blocks = Vec::new();
    let mut open: Option<Block> = None;
    for (i, line) in md.lines().enumerate() {
        let t = line.trim_start();
        match open.as_mut() {
            None => {
                if let Some(info) = t.strip_prefix("```") {
                    open = Some(Block {
                        info: info.trim().to_string(),
                        line: i + 1,
                        body: String::new(),
                    });
                }
            }
            Some(b) => {
                if t.trim_end() == "```" {
                    blocks.push(open.take().expect("open block"));
                } else {
                    b.body.push_str(line);
                    b.body.push('\n');
                }
            }
        }
    }
    assert!(open.is_none(), "unterminated code fence");
    blocks
}

/// The bash blocks the docs test runs, in order.
fn runnable_blocks(md: &str) -> Vec<Block> {
    fenced_blocks(md)
        .into_iter()
        .filter(|b| b.info == "bash")
        .filter(|b| b.body.lines().find(|l| !l.trim().is_empty()).map(str::trim) != Some(NOT_RUN))
        .collect()
}

/// Stops the guide's cluster and kills whatever the script left running, whatever happened.
struct Cleanup {
    cluster_dir: PathBuf,
    script_pgid: Option<i32>,
}

impl Drop for Cleanup {
    fn drop(&mut self) {
        if let Some(pgid) = self.script_pgid {
            // SAFETY: plain kill(2) on the process group the script runs in (its own group,
            // created at spawn), so nothing outside the test is touched.
            unsafe {
                libc::kill(-pgid, libc::SIGKILL);
            }
        }
        if self.cluster_dir.exists() {
            let _ = Command::new(kelp_bin())
                .arg("down")
                .arg("--dir")
                .arg(&self.cluster_dir)
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .status();
        }
    }
}

fn tool_present(cmd: &str, args: &[&str]) -> bool {
    Command::new(cmd)
        .args(args)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success())
}

#[test]
fn getting_started_runs_as_written() {
    assert!(
        tool_present("python3", &["-c", "import boto3"]) && tool_present("aws", &["--version"]),
        "the guide uses python3 with boto3 and the aws CLI: install them \
         (python3 -m pip install boto3 awscli; .ci/run does)"
    );
    let guide = read_doc(GUIDE);
    let blocks = runnable_blocks(&guide);
    assert!(
        blocks.len() >= 5,
        "expected the guide's bash blocks, found {}",
        blocks.len()
    );

    let tmp = tempfile::tempdir().expect("temp dir");
    let work = tmp.path().join("guide");
    std::fs::create_dir(&work).expect("work dir");
    let mut script = String::from("set -euo pipefail\n");
    for b in &blocks {
        script.push_str(&format!("echo '+++ {GUIDE}:{} ' >&2\n", b.line));
        script.push_str(&b.body);
    }
    let script_path = tmp.path().join("guide.sh");
    std::fs::write(&script_path, &script).expect("writing the script");

    let bin_dir = kelp_bin().parent().expect("binary directory").to_path_buf();
    let path = format!(
        "{}:{}",
        bin_dir.display(),
        std::env::var("PATH").unwrap_or_default()
    );
    let out_path = tmp.path().join("out.log");
    let out = std::fs::File::create(&out_path).expect("log file");
    let mut cleanup = Cleanup {
        cluster_dir: work.join("kelp-data"),
        script_pgid: None,
    };
    let mut child = Command::new("bash")
        .arg("-euo")
        .arg("pipefail")
        .arg(&script_path)
        .current_dir(&work)
        .env("PATH", path)
        .env_remove("KELP_CONF")
        // the reader's own AWS settings must not leak in; s3.env provides everything
        .env("AWS_CONFIG_FILE", tmp.path().join("aws-config"))
        .env(
            "AWS_SHARED_CREDENTIALS_FILE",
            tmp.path().join("aws-credentials"),
        )
        .env("AWS_PAGER", "")
        .stdin(Stdio::null())
        .stdout(out.try_clone().expect("log file"))
        .stderr(out)
        .process_group(0)
        .spawn()
        .expect("starting bash");
    cleanup.script_pgid = Some(child.id() as i32);

    let start = Instant::now();
    let status = loop {
        if let Some(s) = child.try_wait().expect("waiting for bash") {
            break Some(s);
        }
        if start.elapsed() > TIMEOUT {
            break None;
        }
        std::thread::sleep(Duration::from_millis(200));
    };
    let mut log = String::new();
    std::fs::File::open(&out_path)
        .and_then(|mut f| f.read_to_string(&mut log))
        .expect("reading the log");
    match status {
        None => panic!("{GUIDE} did not finish within {TIMEOUT:?}; its output so far:\n{log}"),
        Some(s) if !s.success() => panic!(
            "a command of {GUIDE} failed ({s}); the last `+++` line names the block it was in:\n{log}"
        ),
        Some(_) => eprintln!("{GUIDE} ran in {:.0?}", start.elapsed()),
    }
    drop(cleanup);
}

/// The command lines of a Markdown text that run `kelp`: from bash blocks, and inline code
/// spans in the prose that start with `kelp `.
fn kelp_command_lines(md: &str) -> Vec<String> {
    let mut lines = Vec::new();
    for b in fenced_blocks(md).into_iter().filter(|b| b.info == "bash") {
        lines.extend(b.body.lines().map(str::to_string));
    }
    let mut in_fence = false;
    for line in md.lines() {
        if line.trim_start().starts_with("```") {
            in_fence = !in_fence;
            continue;
        }
        if in_fence {
            continue;
        }
        for (i, span) in line.split('`').enumerate() {
            if i % 2 == 1 && (span == "kelp" || span.starts_with("kelp ")) {
                lines.push(span.to_string());
            }
        }
    }
    lines
}

/// Splits a shell line into the argument lists of its `kelp` invocations: a comment is dropped,
/// commands are separated at `&&`, `||`, `|`, `;`, and a command substitution's `$(`/`<(`
/// opens a new one. An alternative written `a|b|c` inside one word expands to each of them.
fn kelp_invocations(line: &str) -> Vec<Vec<String>> {
    let line = match line.find(" #") {
        Some(i) => &line[..i],
        None if line.trim_start().starts_with('#') => "",
        None => line,
    };
    let mut commands: Vec<Vec<String>> = vec![Vec::new()];
    for word in line.split_whitespace() {
        match word {
            "&&" | "||" | "|" | ";" => commands.push(Vec::new()),
            _ => {
                let mut w = word;
                for open in ["$(", "<(", "("] {
                    if let Some(rest) = w.strip_prefix(open) {
                        commands.push(Vec::new());
                        w = rest;
                    }
                }
                let w = w.trim_end_matches([')', ';']);
                if !w.is_empty() {
                    commands.last_mut().expect("a command").push(w.to_string());
                }
            }
        }
    }
    let mut out = Vec::new();
    for c in commands {
        // skip leading VAR=value assignments
        let start = c
            .iter()
            .position(|w| !w.contains('=') || w.starts_with('-'));
        let Some(start) = start else { continue };
        if c[start] != "kelp" {
            continue;
        }
        let mut expanded: Vec<Vec<String>> = vec![Vec::new()];
        for w in &c[start + 1..] {
            // shell syntax ends what is checked: redirections, quotes, variables
            if w.starts_with(['>', '<', '"', '\'', '$']) || !w.is_ascii() {
                break;
            }
            if w.contains('|') && !w.starts_with('-') {
                let alts: Vec<&str> = w.split('|').collect();
                expanded = expanded
                    .into_iter()
                    .flat_map(|e| {
                        alts.iter()
                            .map(move |a| [e.clone(), vec![a.to_string()]].concat())
                    })
                    .collect();
            } else {
                for e in &mut expanded {
                    e.push(w.clone());
                }
            }
        }
        out.extend(expanded);
    }
    out
}

/// What `kelp <path> --help` says: its subcommands and its options (with whether each takes a
/// value), parsed from clap's help layout.
struct Help {
    subcommands: BTreeSet<String>,
    options: BTreeMap<String, bool>,
}

fn help<'a>(
    path: &[String],
    cache: &'a mut BTreeMap<Vec<String>, Result<Help, String>>,
) -> Result<&'a Help, String> {
    if !cache.contains_key(path) {
        let out = Command::new(kelp_bin())
            .args(path)
            .arg("--help")
            .output()
            .expect("running kelp");
        let text = String::from_utf8_lossy(&out.stdout).into_owned();
        let parsed = if out.status.success() {
            let mut h = Help {
                subcommands: BTreeSet::new(),
                options: BTreeMap::new(),
            };
            let mut section = "";
            for line in text.lines() {
                if !line.starts_with(' ') && line.ends_with(':') {
                    section = line;
                    continue;
                }
                let t = line.trim_start();
                if section == "Commands:" {
                    if let Some(name) = t.split_whitespace().next() {
                        h.subcommands.insert(name.trim_end_matches(',').to_string());
                    }
                } else if t.starts_with('-') {
                    // "-p, --pool <POOL>  Pool to operate on." / "--detach  Start ..."
                    let spec = t.split("  ").next().unwrap_or(t);
                    let takes_value = spec.contains('<');
                    for name in spec.split([',', ' ']).filter(|w| w.starts_with('-')) {
                        h.options.insert(name.to_string(), takes_value);
                    }
                }
            }
            Ok(h)
        } else {
            Err(format!(
                "`kelp {} --help` failed: {}",
                path.join(" "),
                String::from_utf8_lossy(&out.stderr)
            ))
        };
        cache.insert(path.to_vec(), parsed);
    }
    cache[path].as_ref().map_err(Clone::clone)
}

/// `kelp` followed by a subcommand path, as written on a command line.
fn shown(path: &[String]) -> String {
    std::iter::once("kelp")
        .chain(path.iter().map(String::as_str))
        .collect::<Vec<_>>()
        .join(" ")
}

/// Checks one documented invocation: walks its subcommand path through the binary's help and
/// checks every option against the help of the command it was written for.
fn check_invocation(
    args: &[String],
    cache: &mut BTreeMap<Vec<String>, Result<Help, String>>,
) -> Result<Vec<String>, String> {
    let mut path: Vec<String> = Vec::new();
    let mut i = 0;
    let mut descending = true;
    while i < args.len() {
        let w = &args[i];
        let h = help(&path, cache)?;
        if w.starts_with('-') && w.len() > 1 {
            let name = w.split('=').next().unwrap_or(w);
            match h.options.get(name) {
                None => return Err(format!("`{}` has no option {name}", shown(&path))),
                Some(true) if !w.contains('=') => i += 1, // its value
                Some(_) => {}
            }
        } else if descending && !h.subcommands.is_empty() {
            if h.subcommands.contains(w.as_str()) {
                path.push(w.clone());
            } else {
                return Err(format!("`{}` has no subcommand {w}", shown(&path)));
            }
        } else {
            descending = false; // a positional argument: no subcommands after it
        }
        i += 1;
    }
    help(&path, cache)?;
    Ok(path)
}

#[test]
fn documented_kelp_commands_exist() {
    let mut cache = BTreeMap::new();
    let mut paths = BTreeSet::new();
    let mut errors = Vec::new();
    for doc in ["README.md", GUIDE] {
        for line in kelp_command_lines(&read_doc(doc)) {
            for inv in kelp_invocations(&line) {
                match check_invocation(&inv, &mut cache) {
                    Ok(p) => {
                        paths.insert(p);
                    }
                    Err(e) => errors.push(format!("{doc}: `kelp {}`: {e}", inv.join(" "))),
                }
            }
        }
    }
    assert!(
        paths.len() >= 10,
        "expected many documented kelp commands, found {paths:?}"
    );
    assert!(
        errors.is_empty(),
        "documented commands the binary does not know:\n{}",
        errors.join("\n")
    );
}

#[test]
fn invocations_are_split_like_the_shell() {
    let s = |v: &[&str]| v.iter().map(|w| w.to_string()).collect::<Vec<_>>();
    assert_eq!(
        kelp_invocations("cargo install --locked --path crates/kelp && kelp up    # build `kelp`"),
        vec![s(&["up"])]
    );
    assert_eq!(
        kelp_invocations("KELP_CONF=x kelp rados -p data get hello - | head"),
        vec![s(&["rados", "-p", "data", "get", "hello", "-"])]
    );
    assert_eq!(
        kelp_invocations("kelp store mkfs|fsck"),
        vec![s(&["store", "mkfs"]), s(&["store", "fsck"])]
    );
    assert_eq!(
        kelp_invocations("source <(kelp completions bash)"),
        vec![s(&["completions", "bash"])]
    );
    assert_eq!(kelp_invocations("kelp crush …"), vec![s(&["crush"])]);
    assert!(kelp_invocations("# kelp up").is_empty());
    let md = "```bash\n# not run by the docs test\ncargo build\n```\n\n```console\n$ kelp status\n```\n\n```bash\nkelp up\n```\n";
    let run = runnable_blocks(md);
    assert_eq!(run.len(), 1);
    assert_eq!(run[0].body, "kelp up\n");
    assert_eq!(run[0].line, 10);
}
