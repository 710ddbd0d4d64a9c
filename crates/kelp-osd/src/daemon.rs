//! `kelp osd`: the OSD daemon around `OsdService`.
//!
//! Start-up: mount the store (its `store_id` is the OSD's uuid); ask the monitors for the OSD
//! id of that uuid (creating it on first start) and refuse to run if it is not the id we were
//! told to be (a store moved to the wrong OSD); take the current OSD map; open the PGs this
//! OSD holds; start serving; tell the monitors it is up at its address. Then follow map
//! updates, booting again whenever a map says this (running) OSD is down.
//!
//! Shut-down (SIGTERM/SIGINT, or the `shutdown` future): tell the monitors this OSD is going
//! down (best effort, so peers stop sending to it at once), stop serving, close the store.

use std::future::Future;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use kelp_maps::OsdMap;
use kelp_monc::MonClient;
use kelp_msgr::{KeyLookup, Keyring, Messenger, ReloadingKeyring};
use kelp_proto::{MonCommand, MonReply, OsdBoot};
use kelp_store::{KelpStore, StoreConfig};
use tracing::{debug, info, warn};

use crate::exec::ExecError;
use crate::net::{MsgrPeers, OsdDispatcher};
use crate::service::{ActivationRequest, OsdConfig, OsdService};

/// Why the OSD daemon could not start or stop cleanly.
#[derive(Debug, thiserror::Error)]
pub enum DaemonError {
    #[error("store: {0}")]
    Store(#[from] kelp_store::StoreError),
    #[error("monitors: {0}")]
    Mon(#[from] kelp_monc::MonClientError),
    #[error("network: {0}")]
    Msgr(#[from] kelp_msgr::MsgrError),
    /// The keyring has no secret for this OSD (`osd.N`).
    #[error("the keyring has no key for {entity}")]
    NoKey { entity: String },
    /// The store was made for another OSD (a data directory given to the wrong OSD id).
    #[error("the store in {} belongs to osd.{owner}, not osd.{id}", data.display())]
    WrongOsd { data: PathBuf, owner: i32, id: i32 },
    /// The monitors answered a command with a reply of another kind.
    #[error("unexpected reply to {command}: {reply:?}")]
    UnexpectedReply {
        command: &'static str,
        reply: Box<MonReply>,
    },
    /// The monitors' map subscription ended before the first map arrived.
    #[error("the map subscription ended")]
    MapSubscriptionEnded,
    /// The metrics endpoint could not be started.
    #[error("metrics: {0}")]
    Metrics(#[from] kelp_metrics::MetricsError),
    /// The PGs this OSD holds could not be opened from the store.
    #[error("opening PGs: {0}")]
    OpenPgs(#[source] ExecError),
    /// A blocking store task (mount, flush, close) panicked or was cancelled.
    #[error("{what} task failed: {source}")]
    Task {
        what: &'static str,
        #[source]
        source: tokio::task::JoinError,
    },
}

/// What `kelp osd` needs to run.
pub struct DaemonOptions {
    pub id: i32,
    /// Store directory (made with `kelp store mkfs`).
    pub data: PathBuf,
    pub mons: Vec<SocketAddr>,
    /// Keys of every entity that may connect (this OSD's own included).
    pub keyring: Keyring,
    /// The file `keyring` came from: read again when an unknown entity connects (a new OSD
    /// or client added since this OSD started).
    pub keyring_path: Option<PathBuf>,
    /// Address to serve on (`127.0.0.1:0` picks a free port).
    pub bind: SocketAddr,
    /// CRUSH host bucket to sit under.
    pub host: String,
    /// CRUSH weight, 16.16.
    pub crush_weight: u32,
    pub store: StoreConfig,
    pub osd: OsdConfig,
    /// Where to serve `/metrics` (port 0: any free port); `None`: no metrics endpoint.
    pub metrics_addr: Option<SocketAddr>,
    /// The device class to report at boot (`--device-class`); `None`: the class of the data
    /// directory's device, if it can be told (`device_class::detect`).
    pub device_class: Option<String>,
}

/// Binds this OSD to its device class in CRUSH if it has none yet (an operator's
/// `set-device-class` stays, as with Ceph's `osd_class_update_on_start`). Best effort: a
/// refusal is logged and the OSD runs on.
async fn report_device_class(
    mon: &MonClient,
    id: i32,
    data: &std::path::Path,
    wanted: Option<&str>,
    map: &kelp_maps::OsdMap,
) {
    let Some(class) = wanted.or_else(|| crate::device_class::detect(data)) else {
        return;
    };
    match map.crush.device_class(id) {
        Some(c) if c == class => return,
        Some(c) => {
            info!(
                osd = id,
                have = c,
                reported = class,
                "keeping the device class set in CRUSH"
            );
            return;
        }
        None => {}
    }
    let cmd = MonCommand::CrushSetDeviceClass {
        class: class.to_string(),
        osds: vec![id],
    };
    match mon.command(&cmd).await {
        Ok(MonReply::Done { .. }) => info!(osd = id, class, "device class reported"),
        Ok(other) => warn!(osd = id, class, "reporting the device class: {other:?}"),
        Err(e) => warn!(osd = id, class, "reporting the device class: {e}"),
    }
}

/// Runs the OSD until `shutdown` resolves.
pub async fn run(
    opts: DaemonOptions,
    shutdown: impl Future<Output = ()>,
) -> Result<(), DaemonError> {
    let id = opts.id;
    let entity = format!("osd.{id}");
    let secret = opts
        .keyring
        .secret_for(&entity)
        .ok_or_else(|| DaemonError::NoKey {
            entity: entity.clone(),
        })?;
    let data = opts.data.clone();
    // A previous instance that is still exiting (a thread finishing a disk flush) holds the
    // store's lock for a moment: wait for it rather than fail a restart.
    let store = tokio::task::spawn_blocking(move || {
        let deadline = std::time::Instant::now() + STORE_LOCK_WAIT;
        loop {
            match KelpStore::mount(&data, opts.store.clone()) {
                Err(kelp_store::StoreError::Locked { .. })
                    if std::time::Instant::now() < deadline =>
                {
                    std::thread::sleep(Duration::from_millis(100));
                }
                other => return other,
            }
        }
    })
    .await
    .map_err(|source| DaemonError::Task {
        what: "mount",
        source,
    })??;
    let uuid = store.superblock().store_id.clone();
    let store = Arc::new(store);
    info!(%entity, %uuid, data = %opts.data.display(), "store mounted");

    let mon = Arc::new(MonClient::new(&entity, secret.clone(), opts.mons.clone())?);
    let create = MonCommand::OsdCreate {
        id: Some(id),
        uuid: uuid.clone(),
        host: opts.host.clone(),
        crush_weight: opts.crush_weight,
    };
    // Monitors that are still forming (or creating the cluster state) refuse for a moment:
    // keep asking for up to a minute before giving up.
    let started = std::time::Instant::now();
    let reply = loop {
        match mon.command(&create).await {
            Ok(reply) => break reply,
            Err(kelp_monc::MonClientError::Refused { message })
                if message.contains("not initialised")
                    && started.elapsed() < Duration::from_secs(60) =>
            {
                tokio::time::sleep(Duration::from_millis(250)).await;
            }
            Err(e) => return Err(e.into()),
        }
    };
    match reply {
        MonReply::OsdId { id: got, .. } if got == id => {}
        MonReply::OsdId { id: owner, .. } => {
            return Err(DaemonError::WrongOsd {
                data: opts.data.clone(),
                owner,
                id,
            });
        }
        other => {
            return Err(DaemonError::UnexpectedReply {
                command: "osd create",
                reply: Box::new(other),
            });
        }
    }
    let mut maps = mon.subscribe(None)?;
    let first = maps.next().await.ok_or(DaemonError::MapSubscriptionEnded)?;
    report_device_class(&mon, id, &opts.data, opts.device_class.as_deref(), &first).await;

    let keys: Arc<dyn KeyLookup> = match opts.keyring_path {
        Some(p) => Arc::new(ReloadingKeyring::new(p, opts.keyring)),
        None => Arc::new(opts.keyring),
    };
    // The serving messenger: clients, primaries (replica writes) and our own replica writes.
    let (service_slot, dispatcher) = LateService::new();
    let msgr = Messenger::builder(entity.clone())
        .secret(secret)
        .keys(keys)
        .dispatcher(dispatcher)
        .build()?;
    let peers = Arc::new(MsgrPeers {
        msgr: msgr.clone(),
        timeout: Duration::from_secs(30),
    });
    let scrub_base = opts.osd.scrub.clone();
    let mut osd_cfg = opts.osd;
    // settings read once, at start, from the monitors' central config
    if let Ok(Ok(MonReply::Config(entries))) =
        tokio::time::timeout(Duration::from_secs(5), mon.command(&MonCommand::ConfigDump)).await
    {
        let me = format!("osd.{id}");
        for who in ["global", "osd", me.as_str()] {
            for e in entries
                .iter()
                .filter(|e| e.who == who && e.key == "osd_max_pg_log_entries")
            {
                match e.value.parse::<usize>() {
                    Ok(n) => osd_cfg.max_pg_log_entries = n,
                    Err(_) => warn!(value = %e.value, "ignoring a bad osd_max_pg_log_entries"),
                }
            }
        }
    }
    let service = OsdService::new(osd_cfg, store.clone(), peers, (*first).clone());
    // Commands the OSD sends the monitors on its own (pg_temp requests), one at a time.
    let (mon_tx, mut mon_rx) = tokio::sync::mpsc::unbounded_channel::<MonCommand>();
    service.set_mon_link(mon_tx);
    let mon_forwarder = {
        let mon = mon.clone();
        tokio::spawn(async move {
            while let Some(cmd) = mon_rx.recv().await {
                match mon.command(&cmd).await {
                    Ok(MonReply::Error { message }) => warn!(?cmd, "monitors refused: {message}"),
                    Ok(_) => {}
                    Err(e) => warn!(?cmd, "monitors unreachable: {e}"),
                }
            }
        })
    };
    // PG activation records (`MonCommand::PgActivate`), batched: while one command is on its
    // way, the records queued meanwhile wait and go together in the next.
    let (act_tx, mut act_rx) = tokio::sync::mpsc::unbounded_channel::<ActivationRequest>();
    service.set_activation_link(act_tx);
    let activation_batcher = {
        let mon = mon.clone();
        tokio::spawn(async move {
            while let Some(first) = act_rx.recv().await {
                let mut batch = vec![first];
                while batch.len() < ACTIVATION_BATCH {
                    match act_rx.try_recv() {
                        Ok(r) => batch.push(r),
                        Err(_) => break,
                    }
                }
                let (activations, replies): (Vec<_>, Vec<_>) = batch.into_iter().unzip();
                let n = activations.len();
                let cmd = MonCommand::PgActivate { activations };
                let answer = match tokio::time::timeout(ACTIVATION_TIMEOUT, mon.command(&cmd)).await
                {
                    Ok(Ok(MonReply::PgActivated(v))) if v.len() == n => Ok(v),
                    Ok(Ok(MonReply::Error { message })) => Err(message),
                    Ok(Ok(other)) => Err(format!("unexpected answer {other:?}")),
                    Ok(Err(e)) => Err(format!("monitors unreachable: {e}")),
                    Err(_) => Err(format!(
                        "no answer from the monitors in {} s",
                        ACTIVATION_TIMEOUT.as_secs()
                    )),
                };
                match answer {
                    Ok(verdicts) => {
                        for (reply, v) in replies.into_iter().zip(verdicts) {
                            let _ = reply.send(Ok(v));
                        }
                    }
                    Err(e) => {
                        for reply in replies {
                            let _ = reply
                                .send(Err(crate::error::OsdError::Monitor { reason: e.clone() }));
                        }
                    }
                }
            }
        })
    };
    service
        .set_map((*first).clone())
        .await
        .map_err(DaemonError::OpenPgs)?;
    service_slot.set(service.clone()).ok();
    let addr = msgr.bind(opts.bind).await?;
    info!(%entity, %addr, "serving");
    let metrics = match opts.metrics_addr {
        Some(at) => {
            let msgrs = vec![msgr.clone(), mon.messenger().clone()];
            Some(serve_metrics(&service, msgrs, &entity, at).await?)
        }
        None => None,
    };
    let mut addrs = std::collections::BTreeMap::new();
    addrs.insert("osd".to_string(), addr.to_string());
    if let Some(m) = &metrics {
        addrs.insert("metrics".to_string(), m.url());
    }
    let beacons = mon.spawn_service_beacons(entity.clone(), "osd".into(), addrs);

    let boot = OsdBoot {
        id,
        uuid: uuid.clone(),
        addr,
    };
    // A refused boot (`noup`, or monitors busy electing) is retried below, not fatal.
    let mut last_boot = std::time::Instant::now();
    match mon.osd_boot(&boot).await {
        Ok(epoch) => info!(%entity, epoch, "marked up"),
        Err(e) => warn!(%entity, "boot refused (will retry): {e}"),
    }
    let stats_task = tokio::spawn(report_stats(service.clone(), mon.clone()));
    let scrubber = service.start_scrubber();
    let watch_ticker = crate::watch::start(Arc::downgrade(service.watches()));
    let snap_trimmer = crate::snap_trim::start(&service);
    let pg_remover = crate::pg_remover::start(&service);
    let config_follower = tokio::spawn(follow_scrub_config(
        mon.clone(),
        Arc::downgrade(&service),
        scrub_base,
        id,
    ));
    let heartbeats = tokio::spawn(crate::heartbeat::run(
        service.clone(),
        msgr.clone(),
        mon.clone(),
    ));

    tokio::pin!(shutdown);
    let mut retry = tokio::time::interval(BOOT_RETRY);
    retry.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            _ = &mut shutdown => break,
            next = maps.next() => {
                let Some(map) = next else {
                    warn!("monitor subscription ended");
                    break;
                };
                if let Err(e) = service.set_map((*map).clone()).await {
                    warn!(epoch = map.epoch, "applying map: {e}");
                }
                if needs_boot(&map, id, addr) {
                    // Marked down while alive (a frozen OSD, a lost session): boot again.
                    last_boot = std::time::Instant::now();
                    match mon.osd_boot(&boot).await {
                        Ok(e) => info!(epoch = e, "the map says this OSD is down; marked up again"),
                        Err(e) => warn!("boot: {e}"),
                    }
                }
            }
            _ = retry.tick() => {
                if needs_boot(&service.map(), id, addr) && last_boot.elapsed() >= BOOT_RETRY {
                    last_boot = std::time::Instant::now();
                    match mon.osd_boot(&boot).await {
                        Ok(e) => info!(epoch = e, "marked up"),
                        Err(e) => debug!("boot refused (will retry): {e}"),
                    }
                }
            }
        }
    }
    heartbeats.abort();
    beacons.abort();
    drop(metrics);

    info!(%entity, "shutting down");
    stats_task.abort();
    scrubber.abort();
    watch_ticker.abort();
    snap_trimmer.abort();
    pg_remover.abort();
    config_follower.abort();
    mon_forwarder.abort();
    activation_batcher.abort();
    let down = MonCommand::OsdDown { id };
    match tokio::time::timeout(Duration::from_secs(3), mon.command(&down)).await {
        Ok(Ok(_)) => info!(%entity, "marked down"),
        Ok(Err(e)) => warn!("could not tell the monitors we are going down: {e}"),
        Err(_) => warn!("the monitors did not confirm we are going down within 3 s"),
    }
    msgr.shutdown();
    mon.shutdown();
    drop(service);
    match Arc::try_unwrap(store) {
        Ok(store) => tokio::task::spawn_blocking(move || store.close())
            .await
            .map_err(|source| DaemonError::Task {
                what: "close",
                source,
            })??,
        Err(store) => {
            // Requests still hold the store: flush what is committed; Drop closes the rest.
            let s = store.clone();
            tokio::task::spawn_blocking(move || kelp_store::ObjectStore::flush(&*s))
                .await
                .map_err(|source| DaemonError::Task {
                    what: "flush",
                    source,
                })??;
        }
    }
    info!(%entity, "stopped");
    Ok(())
}

/// Starts the `/metrics` endpoint: the common and messenger metrics and the OSD's own
/// (`crate::metrics`), read from the service at each scrape.
async fn serve_metrics(
    service: &Arc<OsdService>,
    msgrs: Vec<Messenger>,
    entity: &str,
    at: SocketAddr,
) -> Result<kelp_metrics::MetricsServer, DaemonError> {
    let mut reg = kelp_metrics::Registry::new();
    reg.register_common(entity, "osd");
    service.metrics().register(&mut reg);
    let weak = Arc::downgrade(service);
    reg.snapshot(crate::metrics::snapshot_metrics(), move |s| {
        if let Some(svc) = weak.upgrade() {
            let st = svc.stats();
            let inputs = crate::metrics::SnapshotInputs {
                store: svc.store_stats(),
                io: st.io(),
                recovery: st.recovery(),
                full_ratio_ppm: st.full_ratio_ppm(),
                map_epoch: svc.map().epoch,
            };
            crate::metrics::snapshot(svc.metrics(), &inputs, s);
        }
    });
    reg.register_msgr(move || kelp_msgr::metrics_counts(&msgrs));
    let server = kelp_metrics::serve(at, Arc::new(reg)).await?;
    info!(%entity, url = %server.url(), "metrics endpoint");
    Ok(server)
}

/// Sends the monitors this OSD's statistics every `osd_stats_interval` (the leader's answer
/// carries the interval and the full ratio from the central config).
async fn report_stats(service: Arc<OsdService>, mon: Arc<MonClient>) {
    let mut interval = Duration::from_secs(2);
    loop {
        service.settle_peering(PEERING_REPORT_WAIT).await;
        let mut report = service.stats_report().await;
        if service.is_peering() {
            // A map arrived while the report was being made: report what peering settles on.
            service.settle_peering(PEERING_REPORT_WAIT).await;
            report = service.stats_report().await;
        }
        let sent =
            tokio::time::timeout(interval.max(Duration::from_secs(5)), mon.osd_stats(&report));
        match sent.await {
            Ok(Ok(ack)) => {
                interval = Duration::from_millis(ack.interval_ms.clamp(100, 3_600_000));
                service.stats().set_full_ratio_ppm(ack.full_ratio_ppm);
            }
            Ok(Err(e)) => debug!("stats report not taken: {e}"),
            Err(_) => debug!("stats report not answered in time"),
        }
        // Next report at the interval, or shortly after a PG changed state (a short delay
        // gathers the changes of one map into one report).
        tokio::select! {
            () = tokio::time::sleep(interval) => {}
            () = service.stats().state_changed.notified() => {
                tokio::time::sleep(STATE_REPORT_DELAY.min(interval)).await;
            }
        }
    }
}

/// How long a report waits for PGs that are peering to finish.
const PEERING_REPORT_WAIT: Duration = Duration::from_secs(1);

/// How long after a PG state change the OSD reports it.
const STATE_REPORT_DELAY: Duration = Duration::from_millis(100);

/// How often the OSD re-reads the central config for its scrub and recovery settings.
const CONFIG_REFRESH: Duration = Duration::from_secs(5);

/// Applies the scrub and recovery keys of the monitors' central config (`kelp config set osd
/// osd_scrub_sleep 0.1`, `osd_max_backfills 4`) to the running OSD, re-reading it every
/// `CONFIG_REFRESH`.
async fn follow_scrub_config(
    mon: Arc<MonClient>,
    service: std::sync::Weak<OsdService>,
    base: crate::scrub::ScrubConfig,
    id: i32,
) {
    loop {
        match mon.command(&MonCommand::ConfigDump).await {
            Ok(MonReply::Config(entries)) => match service.upgrade() {
                Some(s) => {
                    s.set_scrub_config(base.with_central(&entries, id));
                    s.set_recovery_config(
                        crate::recovery::RecoveryConfig::default().with_central(&entries, id),
                    );
                    s.watches().set_timeout(watch_timeout(&entries, id));
                }
                None => return,
            },
            Ok(_) => {}
            Err(e) => tracing::debug!("reading the central config: {e}"),
        }
        tokio::time::sleep(CONFIG_REFRESH).await;
    }
}

/// `osd_client_watch_timeout` from the central config (most specific entry wins).
fn watch_timeout(entries: &[kelp_proto::ConfigEntry], id: i32) -> Duration {
    let me = format!("osd.{id}");
    let key = &kelp_config::keys::OSD_CLIENT_WATCH_TIMEOUT;
    ["global", "osd", me.as_str()]
        .iter()
        .filter_map(|who| {
            entries
                .iter()
                .find(|e| e.who == *who && e.key == key.name)
                .and_then(|e| e.value.parse::<f64>().ok())
                .filter(|s| s.is_finite() && *s > 0.0)
        })
        .next_back()
        .map_or(key.default.as_duration(), Duration::from_secs_f64)
}

/// How often a down OSD asks to be marked up again while its boots are refused (`noup`).
const BOOT_RETRY: Duration = Duration::from_secs(2);

/// How long a starting OSD waits for a previous instance to release the store's lock.
const STORE_LOCK_WAIT: Duration = Duration::from_secs(15);

/// Most PG activation records sent in one `PgActivate` command.
const ACTIVATION_BATCH: usize = 512;

/// How long a `PgActivate` command may take before its PGs retry their peering.
const ACTIVATION_TIMEOUT: Duration = Duration::from_secs(10);

fn needs_boot(map: &OsdMap, id: i32, addr: SocketAddr) -> bool {
    match map.osds.get(&id) {
        Some(o) => !o.up || o.addr != Some(addr),
        None => false,
    }
}

/// A dispatcher that answers "not ready" until the service exists.
struct LateService {
    slot: Arc<std::sync::OnceLock<Arc<OsdService>>>,
}

impl LateService {
    fn new() -> (Arc<std::sync::OnceLock<Arc<OsdService>>>, Arc<LateService>) {
        let slot = Arc::new(std::sync::OnceLock::new());
        (slot.clone(), Arc::new(LateService { slot }))
    }
}

#[async_trait::async_trait]
impl kelp_msgr::Dispatcher for LateService {
    async fn handle_request(
        &self,
        req: kelp_msgr::Request,
    ) -> Result<kelp_msgr::Response, kelp_msgr::RemoteError> {
        match self.slot.get() {
            Some(service) => {
                OsdDispatcher {
                    service: service.clone(),
                }
                .handle_request(req)
                .await
            }
            None => Err(kelp_msgr::RemoteError::new(
                crate::net::BAD_REQUEST,
                "the OSD is still starting",
            )),
        }
    }
}
