//! Shared pieces of the NBD integration tests: a server on 127.0.0.1 (random port) and on a
//! Unix socket in a temporary directory, run on its own runtime thread and stopped on drop;
//! running client tools with a time limit; a minimal raw NBD client for protocol-level checks.
#![allow(clippy::unwrap_used, dead_code)]

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use kelp_nbd::{Exports, MemExports, NbdServer, ServerConfig};

/// Name of every thread the test server runs on (its runtime's workers included).
pub const SERVER_THREAD: &str = "kelp-nbd-test-server";

pub struct TestServer {
    pub addr: SocketAddr,
    pub socket: PathBuf,
    stop: Option<tokio::sync::watch::Sender<bool>>,
    thread: Option<std::thread::JoinHandle<()>>,
    _dir: tempfile::TempDir,
}

impl TestServer {
    pub fn start(exports: MemExports) -> Self {
        Self::start_with(exports, ServerConfig::default())
    }

    pub fn start_with(exports: MemExports, cfg: ServerConfig) -> Self {
        Self::start_exports(Arc::new(exports), cfg)
    }

    /// Serves any catalogue.
    pub fn start_exports(catalogue: Arc<dyn Exports>, cfg: ServerConfig) -> Self {
        let dir = tempfile::tempdir().unwrap();
        let socket = dir.path().join("nbd.sock");
        let tcp = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        tcp.set_nonblocking(true).unwrap();
        let addr = tcp.local_addr().unwrap();
        let unix = std::os::unix::net::UnixListener::bind(&socket).unwrap();
        unix.set_nonblocking(true).unwrap();
        let (stop_tx, stop_rx) = tokio::sync::watch::channel(false);
        let server_exports = catalogue;
        let thread = std::thread::Builder::new()
            .name(SERVER_THREAD.into())
            .spawn(move || {
                let rt = tokio::runtime::Builder::new_multi_thread()
                    .worker_threads(2)
                    .thread_name(SERVER_THREAD)
                    .enable_all()
                    .build()
                    .unwrap();
                rt.block_on(async move {
                    let server = NbdServer::new(server_exports, cfg);
                    let tcp = tokio::net::TcpListener::from_std(tcp).unwrap();
                    let unix = tokio::net::UnixListener::from_std(unix).unwrap();
                    let mut a = stop_rx.clone();
                    let mut b = stop_rx;
                    let (x, y) = tokio::join!(
                        server.serve_tcp(tcp, async move {
                            let _ = a.wait_for(|s| *s).await;
                        }),
                        server.serve_unix(unix, async move {
                            let _ = b.wait_for(|s| *s).await;
                        })
                    );
                    x.unwrap();
                    y.unwrap();
                });
            });
        let thread = thread.unwrap();
        Self {
            addr,
            socket,
            stop: Some(stop_tx),
            thread: Some(thread),
            _dir: dir,
        }
    }

    pub fn uri(&self, export: &str) -> String {
        format!("nbd://{}/{}", self.addr, export)
    }

    pub fn unix_uri(&self, export: &str) -> String {
        format!("nbd+unix:///{}?socket={}", export, self.socket.display())
    }
}

impl TestServer {
    /// Tells the server to stop (it stops accepting and lets connections finish).
    pub fn signal_stop(&self) {
        if let Some(stop) = &self.stop {
            let _ = stop.send(true);
        }
    }

    /// Waits until both listeners' serve calls have returned; fails after `limit`.
    pub fn join(&mut self, limit: Duration) {
        self.signal_stop();
        let t = self.thread.take().unwrap();
        let deadline = Instant::now() + limit;
        while !t.is_finished() {
            assert!(
                Instant::now() < deadline,
                "the server did not stop within {limit:?}"
            );
            std::thread::sleep(Duration::from_millis(20));
        }
        t.join().expect("the server thread panicked");
    }
}

impl Drop for TestServer {
    fn drop(&mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(true);
        }
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// Fails the test (does not skip it) when a client tool is missing.
pub fn require_tool(tool: &str, package: &str) {
    let found = std::env::var_os("PATH")
        .map(|p| std::env::split_paths(&p).any(|d| d.join(tool).is_file()))
        .unwrap_or(false);
    assert!(
        found,
        "required NBD client tool `{tool}` is missing: apt-get install {package}"
    );
}

/// A `PATH` whose first `python3` can import libnbd's Python module (nbdsh runs `python3`).
pub fn path_for_nbdsh() -> String {
    let path = std::env::var("PATH").unwrap_or_default();
    for py in ["python3", "/usr/bin/python3"] {
        let ok = Command::new(py)
            .args(["-c", "import nbd"])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status()
            .is_ok_and(|s| s.success());
        if ok {
            let dir = Path::new(py).parent().filter(|d| !d.as_os_str().is_empty());
            return match dir {
                Some(d) => format!("{}:{path}", d.display()),
                None => path,
            };
        }
    }
    panic!("required Python module `nbd` is missing: apt-get install python3-libnbd");
}

/// Runs a command to completion within `limit`, killing it (and failing) if it takes longer.
pub fn run(cmd: &mut Command, limit: Duration) -> Output {
    let shown = format!("{cmd:?}");
    let mut child = cmd
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| panic!("cannot start {shown}: {e}"));
    let mut out = child.stdout.take().unwrap();
    let mut err = child.stderr.take().unwrap();
    let out_t = std::thread::spawn(move || {
        let mut v = Vec::new();
        let _ = out.read_to_end(&mut v);
        v
    });
    let err_t = std::thread::spawn(move || {
        let mut v = Vec::new();
        let _ = err.read_to_end(&mut v);
        v
    });
    let deadline = Instant::now() + limit;
    let status = loop {
        if let Some(s) = child.try_wait().unwrap() {
            break s;
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            panic!("{shown} did not finish within {limit:?}");
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    Output {
        status,
        stdout: out_t.join().unwrap(),
        stderr: err_t.join().unwrap(),
    }
}

/// Runs a command and fails the test with its output unless it succeeds; returns stdout.
pub fn run_ok(cmd: &mut Command, limit: Duration) -> String {
    let shown = format!("{cmd:?}");
    let o = run(cmd, limit);
    let stdout = String::from_utf8_lossy(&o.stdout).into_owned();
    assert!(
        o.status.success(),
        "{shown} failed ({}):\nstdout:\n{stdout}\nstderr:\n{}",
        o.status,
        String::from_utf8_lossy(&o.stderr)
    );
    stdout
}

/// Deterministic pseudo-random bytes (xorshift), with every 5th 64 KiB block left zero so
/// that copies have holes to find.
pub fn pattern(len: usize, seed: u64) -> Vec<u8> {
    let mut x = seed | 1;
    let mut v = vec![0u8; len];
    for (i, chunk) in v.chunks_mut(8).enumerate() {
        if (i * 8 / 65536) % 5 == 4 {
            continue;
        }
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        let b = x.to_le_bytes();
        chunk.copy_from_slice(&b[..chunk.len()]);
    }
    v
}

// ---------------------------------------------------------------------------------------------
// A raw, blocking NBD client: just enough protocol to check the server byte by byte.

pub const NBD_MAGIC: u64 = 0x4e42_444d_4147_4943;
pub const IHAVEOPT: u64 = 0x4948_4156_454f_5054;
pub const OPT_REPLY_MAGIC: u64 = 0x0003_e889_0455_65a9;

pub struct Raw {
    pub s: TcpStream,
}

#[derive(Debug, PartialEq, Eq)]
pub struct OptReply {
    pub option: u32,
    pub typ: u32,
    pub data: Vec<u8>,
}

#[derive(Debug, PartialEq, Eq)]
pub struct Reply {
    pub handle: u64,
    /// 0 on success.
    pub error: u32,
    /// Read data (holes expanded to zeros) or block-status descriptors.
    pub data: Vec<u8>,
    pub chunk_types: Vec<u16>,
}

impl Raw {
    /// Connects and reads the greeting; checks the magic numbers and flags.
    pub fn connect(addr: SocketAddr) -> Self {
        let s = TcpStream::connect(addr).unwrap();
        s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
        s.set_nodelay(true).unwrap();
        let mut r = Raw { s };
        assert_eq!(r.u64(), NBD_MAGIC);
        assert_eq!(r.u64(), IHAVEOPT);
        assert_eq!(r.u16(), 3, "handshake flags: FIXED_NEWSTYLE | NO_ZEROES");
        r
    }

    pub fn send(&mut self, b: &[u8]) {
        self.s.write_all(b).unwrap();
    }
    pub fn exact(&mut self, n: usize) -> Vec<u8> {
        let mut v = vec![0u8; n];
        self.s.read_exact(&mut v).unwrap();
        v
    }
    pub fn u16(&mut self) -> u16 {
        u16::from_be_bytes(self.exact(2).try_into().unwrap())
    }
    pub fn u32(&mut self) -> u32 {
        u32::from_be_bytes(self.exact(4).try_into().unwrap())
    }
    pub fn u64(&mut self) -> u64 {
        u64::from_be_bytes(self.exact(8).try_into().unwrap())
    }

    /// True if the server closed the connection (EOF) within the read timeout.
    pub fn closed(&mut self) -> bool {
        let mut b = [0u8; 1];
        matches!(self.s.read(&mut b), Ok(0))
            || matches!(self.s.read(&mut b), Err(ref e) if e.kind() == std::io::ErrorKind::ConnectionReset)
    }

    pub fn option(&mut self, option: u32, data: &[u8]) {
        let mut b = IHAVEOPT.to_be_bytes().to_vec();
        b.extend_from_slice(&option.to_be_bytes());
        b.extend_from_slice(&(data.len() as u32).to_be_bytes());
        b.extend_from_slice(data);
        self.send(&b);
    }

    pub fn opt_reply(&mut self) -> OptReply {
        assert_eq!(self.u64(), OPT_REPLY_MAGIC);
        let option = self.u32();
        let typ = self.u32();
        let len = self.u32() as usize;
        OptReply {
            option,
            typ,
            data: self.exact(len),
        }
    }

    /// Reads option replies up to and including the final one (ACK or an error).
    pub fn opt_replies(&mut self) -> Vec<OptReply> {
        let mut v = Vec::new();
        loop {
            let r = self.opt_reply();
            let last = r.typ == 1 || r.typ & 0x8000_0000 != 0;
            v.push(r);
            if last {
                return v;
            }
        }
    }

    /// Full handshake with NBD_OPT_GO: optional structured replies and base:allocation.
    /// Returns (size, transmission flags).
    pub fn go(&mut self, export: &str, structured: bool, base_allocation: bool) -> (u64, u16) {
        self.send(&3u32.to_be_bytes()); // FIXED_NEWSTYLE | NO_ZEROES
        if structured {
            self.option(8, &[]);
            assert_eq!(self.opt_replies().last().unwrap().typ, 1);
        }
        if base_allocation {
            let mut d = (export.len() as u32).to_be_bytes().to_vec();
            d.extend_from_slice(export.as_bytes());
            d.extend_from_slice(&1u32.to_be_bytes());
            d.extend_from_slice(&15u32.to_be_bytes());
            d.extend_from_slice(b"base:allocation");
            self.option(10, &d);
            let r = self.opt_replies();
            assert_eq!(r.len(), 2, "{r:?}");
            assert_eq!(r[0].typ, 4);
            assert_eq!(&r[0].data[4..], b"base:allocation");
        }
        let mut d = (export.len() as u32).to_be_bytes().to_vec();
        d.extend_from_slice(export.as_bytes());
        d.extend_from_slice(&0u16.to_be_bytes());
        self.option(7, &d);
        let mut size_flags = None;
        for r in self.opt_replies() {
            assert!(r.typ == 1 || r.typ == 3, "GO refused: {r:?}");
            if r.typ == 3 && r.data[0..2] == [0, 0] {
                size_flags = Some((
                    u64::from_be_bytes(r.data[2..10].try_into().unwrap()),
                    u16::from_be_bytes(r.data[10..12].try_into().unwrap()),
                ));
            }
        }
        size_flags.expect("NBD_INFO_EXPORT is always sent")
    }

    pub fn request(
        &mut self,
        typ: u16,
        flags: u16,
        handle: u64,
        offset: u64,
        len: u32,
        payload: &[u8],
    ) {
        let mut b = 0x2560_9513u32.to_be_bytes().to_vec();
        b.extend_from_slice(&flags.to_be_bytes());
        b.extend_from_slice(&typ.to_be_bytes());
        b.extend_from_slice(&handle.to_be_bytes());
        b.extend_from_slice(&offset.to_be_bytes());
        b.extend_from_slice(&len.to_be_bytes());
        b.extend_from_slice(payload);
        self.send(&b);
    }

    /// Reads one whole reply. `read_len` is the length of the read this may answer (simple
    /// replies carry no length of their own); pass 0 for other commands.
    pub fn reply(&mut self, read_len: usize) -> Reply {
        let magic = self.u32();
        if magic == 0x6744_6698 {
            let error = self.u32();
            let handle = self.u64();
            let data = if error == 0 && read_len > 0 {
                self.exact(read_len)
            } else {
                Vec::new()
            };
            return Reply {
                handle,
                error,
                data,
                chunk_types: Vec::new(),
            };
        }
        assert_eq!(magic, 0x668e_33ef, "reply magic");
        let mut rep = Reply {
            handle: 0,
            error: 0,
            data: Vec::new(),
            chunk_types: Vec::new(),
        };
        loop {
            let flags = self.u16();
            let typ = self.u16();
            rep.handle = self.u64();
            let len = self.u32() as usize;
            let payload = self.exact(len);
            rep.chunk_types.push(typ);
            match typ {
                1 => rep.data.extend_from_slice(&payload[8..]),
                2 => {
                    let n = u32::from_be_bytes(payload[8..12].try_into().unwrap()) as usize;
                    rep.data.extend(std::iter::repeat_n(0u8, n));
                }
                5 => rep.data.extend_from_slice(&payload[4..]),
                t if t & 0x8000 != 0 => {
                    rep.error = u32::from_be_bytes(payload[0..4].try_into().unwrap())
                }
                _ => {}
            }
            if flags & 1 != 0 {
                return rep;
            }
            assert_eq!(self.u32(), 0x668e_33ef, "next chunk magic");
        }
    }
}
