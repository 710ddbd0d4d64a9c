//! Shared fixtures: a test server with a handler that can echo, sleep, fail, panic, hang,
//! count concurrency and push; client builders; a small deterministic PRNG.
#![allow(clippy::unwrap_used)] // test code: a failed unwrap is a failed test
#![allow(dead_code)]

use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use kelp_msgr::*;

pub const ECHO: u16 = 1;
/// meta = u64 LE milliseconds to sleep, then echo.
pub const SLEEP_ECHO: u16 = 2;
pub const FAIL: u16 = 3;
pub const PANIC: u16 = 4;
pub const HANG: u16 = 5;
/// meta = u32 LE count: the server pushes that many one-way messages (type PUSHED, meta = seq).
pub const SUBSCRIBE: u16 = 6;
pub const PUSHED: u16 = 60;
/// Sleeps 20 ms while counting concurrent handlers.
pub const COUNT: u16 = 8;

pub const FAIL_CODE: u32 = 42;

#[derive(Default)]
pub struct TestHandler {
    pub active: AtomicUsize,
    pub max_active: AtomicUsize,
    pub subscribers: Mutex<Vec<Peer>>,
    pub closed: AtomicUsize,
}

#[async_trait::async_trait]
impl Dispatcher for TestHandler {
    async fn handle_request(&self, req: Request) -> Result<Response, RemoteError> {
        match req.msg_type {
            ECHO => {
                // Report the crc the server computed, so the client can check both directions.
                let crc = kelp_types::crc32c(&req.data);
                let mut meta = req.meta.to_vec();
                meta.extend_from_slice(&crc.to_le_bytes());
                Ok(Response::new(ECHO, meta, req.data))
            }
            SLEEP_ECHO => {
                let ms = u64::from_le_bytes(req.meta[..8].try_into().unwrap());
                tokio::time::sleep(Duration::from_millis(ms)).await;
                Ok(Response::new(SLEEP_ECHO, req.meta, req.data))
            }
            FAIL => Err(RemoteError::new(FAIL_CODE, "asked to fail")),
            PANIC => panic!("handler asked to panic"),
            HANG => {
                std::future::pending::<()>().await;
                unreachable!()
            }
            SUBSCRIBE => {
                let n = u32::from_le_bytes(req.meta[..4].try_into().unwrap());
                self.subscribers.lock().unwrap().push(req.peer.clone());
                let peer = req.peer.clone();
                tokio::spawn(async move {
                    for seq in 0..n {
                        peer.send(PUSHED, seq.to_le_bytes().to_vec(), Bytes::new())
                            .await
                            .unwrap();
                    }
                });
                Ok(Response::new(SUBSCRIBE, Bytes::new(), Bytes::new()))
            }
            COUNT => {
                let now = self.active.fetch_add(1, Ordering::SeqCst) + 1;
                self.max_active.fetch_max(now, Ordering::SeqCst);
                tokio::time::sleep(Duration::from_millis(20)).await;
                self.active.fetch_sub(1, Ordering::SeqCst);
                Ok(Response::default())
            }
            other => Err(RemoteError::new(1, format!("unknown msg_type {other}"))),
        }
    }

    fn connection_closed(&self, _peer: &Peer) {
        self.closed.fetch_add(1, Ordering::SeqCst);
    }
}

pub struct Cluster {
    pub keyring: Keyring,
    pub server: Messenger,
    pub addr: SocketAddr,
    pub handler: Arc<TestHandler>,
    pub policy: NetworkPolicy,
}

/// Clients `client.a`, `client.b`, `osd.2`, `osd.3` are in the keyring; the server is `osd.1`.
pub async fn cluster(config: MsgrConfig) -> Cluster {
    let mut keyring = Keyring::new();
    for e in ["client.a", "client.b", "osd.1", "osd.2", "osd.3"] {
        keyring.insert(e, generate_secret()).unwrap();
    }
    let policy = NetworkPolicy::new();
    let handler = Arc::new(TestHandler::default());
    let server = Messenger::builder("osd.1")
        .secret(keyring.secret_for("osd.1").unwrap())
        .keys(Arc::new(keyring.clone()))
        .dispatcher(handler.clone())
        .config(config)
        .policy(policy.clone())
        .build()
        .unwrap();
    let addr = server.bind("127.0.0.1:0".parse().unwrap()).await.unwrap();
    Cluster {
        keyring,
        server,
        addr,
        handler,
        policy,
    }
}

impl Cluster {
    pub fn client(&self, entity: &str) -> Messenger {
        self.client_with(entity, MsgrConfig::default(), None)
    }

    pub fn client_with(
        &self,
        entity: &str,
        config: MsgrConfig,
        dispatcher: Option<Arc<dyn Dispatcher>>,
    ) -> Messenger {
        let mut b = Messenger::builder(entity)
            .secret(self.keyring.secret_for(entity).unwrap())
            .config(config)
            .policy(self.policy.clone());
        if let Some(d) = dispatcher {
            b = b.dispatcher(d);
        }
        b.build().unwrap()
    }

    /// Asserts the server still answers a fresh, well-behaved client.
    pub async fn assert_serving(&self) {
        let c = self.client("client.b");
        let conn = c
            .connect(self.addr)
            .await
            .expect("server stopped accepting");
        let r = conn
            .call(
                ECHO,
                &b"still alive"[..],
                Bytes::new(),
                Duration::from_secs(5),
            )
            .await
            .expect("server stopped answering");
        assert!(r.meta.starts_with(b"still alive"));
        c.shutdown();
    }
}

pub fn sleep_meta(ms: u64, index: u32) -> Vec<u8> {
    let mut m = ms.to_le_bytes().to_vec();
    m.extend_from_slice(&index.to_le_bytes());
    m
}

/// xorshift64*: deterministic, good enough to make garbage.
pub struct Rng(pub u64);

impl Rng {
    pub fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }
    pub fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
    pub fn bytes(&mut self, n: usize) -> Vec<u8> {
        (0..n).map(|_| self.next() as u8).collect()
    }
}

pub fn pattern(len: usize, seed: u64) -> Bytes {
    let mut r = Rng(seed | 1);
    let mut v = Vec::with_capacity(len);
    while v.len() < len {
        v.extend_from_slice(&r.next().to_le_bytes());
    }
    v.truncate(len);
    Bytes::from(v)
}
