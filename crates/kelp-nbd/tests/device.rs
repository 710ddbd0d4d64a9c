//! What a device's failures look like on the wire: each `DeviceError` becomes its NBD error
//! number for that request only, a wrong-length read becomes `EIO`, and a device that panics
//! costs the client one `EIO` reply, not the connection or the server.
#![allow(clippy::unwrap_used)]

mod common;

use std::sync::Arc;

use async_trait::async_trait;
use bytes::Bytes;
use common::{Raw, TestServer};
use kelp_nbd::{BlockDevice, DeviceError, ExportInfo, Exports, Extent, MemDevice, OpenError};

/// Fails reads at chosen offsets (one per `DeviceError` kind), and otherwise passes through.
struct Faulty {
    inner: MemDevice,
}

#[async_trait]
impl BlockDevice for Faulty {
    fn info(&self) -> ExportInfo {
        self.inner.info()
    }
    async fn read(&self, offset: u64, len: u32) -> Result<Bytes, DeviceError> {
        match offset {
            1 => Err(DeviceError::Io("disk on fire".into())),
            2 => Err(DeviceError::NoSpace),
            3 => Err(DeviceError::ReadOnly),
            4 => Err(DeviceError::Invalid("no".into())),
            5 => Err(DeviceError::TooBig),
            6 => Err(DeviceError::Shutdown("going away".into())),
            7 => Ok(Bytes::from_static(b"short")),
            8 => panic!("a device bug"),
            10 => {
                tokio::time::sleep(std::time::Duration::from_secs(60)).await;
                self.inner.read(offset, len).await
            }
            11 => {
                tokio::time::sleep(std::time::Duration::from_secs(3)).await;
                self.inner.read(offset, len).await
            }
            9 => {
                tokio::time::sleep(std::time::Duration::from_millis(500)).await;
                self.inner.read(offset, len).await
            }
            _ => self.inner.read(offset, len).await,
        }
    }
    async fn write(&self, offset: u64, data: Bytes, fua: bool) -> Result<(), DeviceError> {
        self.inner.write(offset, data, fua).await
    }
    async fn flush(&self) -> Result<(), DeviceError> {
        Err(DeviceError::Io("flush failed".into()))
    }
    async fn trim(&self, offset: u64, len: u32) -> Result<(), DeviceError> {
        self.inner.trim(offset, len).await
    }
    async fn write_zeroes(&self, offset: u64, len: u32, no_hole: bool) -> Result<(), DeviceError> {
        self.inner.write_zeroes(offset, len, no_hole).await
    }
    async fn block_status(&self, _offset: u64, _len: u32) -> Result<Vec<Extent>, DeviceError> {
        Ok(Vec::new())
    }
}

struct One(Arc<Faulty>);

#[async_trait]
impl Exports for One {
    async fn open(&self, name: &str) -> Result<Arc<dyn BlockDevice>, OpenError> {
        match name {
            "faulty" => Ok(self.0.clone()),
            "busy" => Err(OpenError::Unavailable("locked by another client".into())),
            other => Err(OpenError::NotFound(other.into())),
        }
    }
    async fn list(&self) -> Result<Vec<(String, String)>, OpenError> {
        Ok(vec![("faulty".into(), String::new())])
    }
}

#[test]
fn device_errors_and_panics_become_error_replies() {
    let dev = Arc::new(Faulty {
        inner: MemDevice::new(1 << 20),
    });
    let srv = TestServer::start_exports(Arc::new(One(dev)), Default::default());
    for structured in [true, false] {
        let mut c = Raw::connect(srv.addr);
        c.go("faulty", structured, structured);
        for (offset, errno) in [
            (1u64, 5u32),
            (2, 28),
            (3, 1),
            (4, 22),
            (5, 75),
            (6, 108),
            (7, 5),
            (8, 5),
        ] {
            c.request(0, 0, offset, offset, 16, &[]);
            let r = c.reply(16);
            assert_eq!((r.handle, r.error), (offset, errno), "read at {offset}");
            assert!(r.data.is_empty());
        }
        c.request(3, 0, 20, 0, 0, &[]);
        assert_eq!(c.reply(0).error, 5, "a failed flush is reported");
        if structured {
            c.request(7, 0, 21, 0, 512, &[]);
            assert_eq!(c.reply(0).error, 5, "a device reporting no extents");
        }
        // The connection still works.
        c.request(1, 0, 22, 4096, 3, b"abc");
        assert_eq!(c.reply(0).error, 0);
        c.request(0, 0, 23, 4096, 3, &[]);
        assert_eq!(c.reply(3).data, b"abc");
    }
    // Open errors map to option replies.
    let mut c = Raw::connect(srv.addr);
    c.send(&1u32.to_be_bytes());
    let mut go = 4u32.to_be_bytes().to_vec();
    go.extend_from_slice(b"busy");
    go.extend_from_slice(&0u16.to_be_bytes());
    c.option(7, &go);
    let r = c.opt_reply();
    assert_eq!(r.typ, 0x8000_0002);
    assert!(String::from_utf8_lossy(&r.data).contains("locked by another client"));
}

#[test]
fn requests_of_one_connection_run_concurrently() {
    let dev = Arc::new(Faulty {
        inner: MemDevice::new(1 << 20),
    });
    let srv = TestServer::start_exports(Arc::new(One(dev)), Default::default());
    let mut c = Raw::connect(srv.addr);
    c.go("faulty", true, false);
    // A slow read, then a fast one: the fast one is answered first.
    c.request(0, 0, 100, 9, 16, &[]);
    c.request(0, 0, 101, 4096, 16, &[]);
    c.request(1, 0, 102, 8192, 2, b"ok");
    let order: Vec<u64> = (0..3).map(|_| c.reply(0).handle).collect();
    assert_eq!(
        order.last(),
        Some(&100),
        "the slow read must not hold up the others: {order:?}"
    );
}

#[test]
fn replies_go_out_while_other_requests_are_still_in_the_device() {
    // The reply writer lets requests still being worked on run before it sends, so that
    // replies finishing together share a send; a request that never finishes must not keep
    // back the replies of the others, batch after batch.
    let dev = Arc::new(Faulty {
        inner: MemDevice::new(1 << 20),
    });
    let srv = TestServer::start_exports(Arc::new(One(dev)), Default::default());
    let mut c = Raw::connect(srv.addr);
    c.go("faulty", true, false);
    c.request(0, 0, 1, 11, 16, &[]); // in the device for 3 s
    let started = std::time::Instant::now();
    for round in 0..5u64 {
        let handles: Vec<u64> = (0..20).map(|i| 100 + round * 20 + i).collect();
        for &h in &handles {
            c.request(0, 0, h, 4096 * (h % 200), 512, &[]);
        }
        let mut seen: Vec<u64> = (0..handles.len()).map(|_| c.reply(0).handle).collect();
        seen.sort();
        assert_eq!(seen, handles, "round {round}");
    }
    assert!(
        started.elapsed() < std::time::Duration::from_secs(2),
        "replies waited for the slow request: {:?}",
        started.elapsed()
    );
    assert_eq!(c.reply(0).handle, 1, "the slow request is answered too");
}

#[test]
fn stop_drops_connections_still_busy_after_the_grace() {
    let dev = Arc::new(Faulty {
        inner: MemDevice::new(1 << 20),
    });
    let cfg = kelp_nbd::ServerConfig {
        shutdown_grace: std::time::Duration::from_millis(200),
        ..Default::default()
    };
    let mut srv = TestServer::start_exports(Arc::new(One(dev)), cfg);
    let mut c = Raw::connect(srv.addr);
    c.go("faulty", true, false);
    c.request(0, 0, 1, 10, 16, &[]); // hangs in the device for a minute
    std::thread::sleep(std::time::Duration::from_millis(100));
    let start = std::time::Instant::now();
    srv.join(std::time::Duration::from_secs(10));
    assert!(
        start.elapsed() < std::time::Duration::from_secs(5),
        "{:?}",
        start.elapsed()
    );
    assert!(c.closed(), "the busy connection is dropped after the grace");
}
