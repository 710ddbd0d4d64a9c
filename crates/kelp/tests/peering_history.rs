//! A PG never goes active without its latest acknowledged writes (`down`), and `kelp osd lost`
//! is the operator's way out, on a real cluster (`kelp up`: one monitor, three OSD processes,
//! `noout`, a pool `two` with size 2 / min_size 1):
//!
//! 1. osd.B (one member of a PG) is killed; the PG serves on osd.A alone and acknowledges new
//!    writes; osd.A is killed; osd.B comes back with its older copy. The PG must be `down`
//!    (not active with the older data): `kelp pg ls` says so, `kelp health detail` names
//!    osd.A, and a client read does not return the older data. When osd.A returns, the PG
//!    peers with it and every acknowledged write reads back.
//! 2. The same again, but osd.A is declared lost (`kelp osd lost`) instead of coming back:
//!    the PG serves osd.B's older copy (the writes only osd.A held are gone, as the operator
//!    asked), takes new writes, and when osd.A returns its stale history is rolled back.

mod heal_support;

use std::collections::BTreeMap;
use std::time::Duration;

use bytes::Bytes;
use heal_support::{
    Cluster, all_active_clean, content, kelp, osd_state, read_back as verify, wait_until,
};
use kelp_client::{ClientConfig, IoCtx, Rados};
use kelp_types::PgId;

/// The state `kelp pg ls` reports for `pg` ("" if none).
fn pg_state(c: &Cluster, pg: PgId) -> String {
    let out = kelp(&["pg", "ls", "--format", "json", "-c", &c.conf()]);
    let Ok(v) = serde_json::from_slice::<serde_json::Value>(&out.stdout) else {
        return String::new();
    };
    v["pg_stats"]
        .as_array()
        .into_iter()
        .flatten()
        .find(|p| p["pgid"] == pg.to_string())
        .and_then(|p| p["state"].as_str())
        .unwrap_or("")
        .to_string()
}

async fn write_all(io: &IoCtx, objects: &BTreeMap<String, Bytes>) {
    for (name, data) in objects {
        io.write_full(name, data.clone())
            .await
            .unwrap_or_else(|e| panic!("writing {name}: {e}"));
    }
}

fn version(names: &[String], v: u64) -> BTreeMap<String, Bytes> {
    names
        .iter()
        .enumerate()
        .map(|(i, n)| (n.clone(), content(v * 1000 + i as u64, 3000 + i * 97)))
        .collect()
}

async fn kill_and_wait_down(c: &Cluster, rados: &Rados, osd: i32) {
    c.sigkill(&format!("osd.{osd}"));
    wait_until(
        &format!("osd.{osd} marked down"),
        Duration::from_secs(30),
        || !osd_state(rados, osd).0,
    )
    .await;
}

async fn start_and_wait_up(c: &Cluster, rados: &Rados, osd: i32) {
    c.start(&format!("osd.{osd}"));
    wait_until(&format!("osd.{osd} up"), Duration::from_secs(30), || {
        osd_state(rados, osd).0
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pg_waits_for_its_latest_writes_and_osd_lost_gives_up_on_them() {
    let c = Cluster::up(3, 8);
    c.cli(&["osd", "set", "noout"]);
    c.cli(&[
        "pool",
        "create",
        "two",
        "--pg-num",
        "8",
        "--size",
        "2",
        "--min-size",
        "1",
    ]);
    let rados = c.connect().await;
    let io = rados.ioctx("two").await.unwrap();

    // v1 everywhere; then pick the PG of `o-0` and the objects in it.
    let all: Vec<String> = (0..48).map(|i| format!("o-{i}")).collect();
    let mut acked = version(&all, 1);
    write_all(&io, &acked).await;
    wait_until("all PGs active+clean", Duration::from_secs(60), || {
        all_active_clean(&c)
    })
    .await;
    let map = rados.osd_map();
    let pool = map.pool_by_name("two").unwrap().id;
    let pg = map.object_pg(pool, "o-0", None, "").unwrap();
    let in_pg: Vec<String> = all
        .iter()
        .filter(|n| map.object_pg(pool, n, None, "").unwrap() == pg)
        .cloned()
        .collect();
    let acting = map.pg_mapping(pg).unwrap().acting;
    assert_eq!(acting.len(), 2, "pg {pg} acting {acting:?}");
    let (a, b) = (acting[0], acting[1]);
    eprintln!("pg {pg}: acting {acting:?}, {} objects", in_pg.len());

    // ---- 1. B down, A alone takes v2, A down, B back: down, not active with v1.
    kill_and_wait_down(&c, &rados, b).await;
    let v2 = version(&in_pg, 2);
    write_all(&io, &v2).await;
    acked.extend(v2.clone());
    kill_and_wait_down(&c, &rados, a).await;
    start_and_wait_up(&c, &rados, b).await;
    wait_until(&format!("pg {pg} down"), Duration::from_secs(30), || {
        pg_state(&c, pg).contains("down")
    })
    .await;
    let detail = c.cli(&["health", "detail"]);
    assert!(
        detail.contains(&format!("osd.{a} (down)")) && detail.contains("kelp osd lost"),
        "health detail does not name osd.{a}:\n{detail}"
    );
    {
        let mut cfg =
            ClientConfig::from_conf_file(std::path::Path::new(&c.conf()), "client.admin").unwrap();
        cfg.op_timeout = Duration::from_secs(3);
        let impatient = Rados::connect(cfg).await.unwrap();
        let io = impatient.ioctx("two").await.unwrap();
        let r = io.read(&in_pg[0], 0, 0).await;
        assert!(
            r.is_err(),
            "a read from the down PG answered {} bytes (v1 is {} bytes, v2 {})",
            r.map(|d| d.len()).unwrap_or(0),
            version(&in_pg, 1)[&in_pg[0]].len(),
            v2[&in_pg[0]].len()
        );
    }
    start_and_wait_up(&c, &rados, a).await;
    wait_until(
        "all PGs active+clean with osd.A back",
        Duration::from_secs(60),
        || all_active_clean(&c),
    )
    .await;
    verify(&io, &acked).await;

    // ---- 2. The same, but osd.A is declared lost: the PG serves B's older copy.
    kill_and_wait_down(&c, &rados, b).await;
    write_all(&io, &version(&in_pg, 3)).await;
    kill_and_wait_down(&c, &rados, a).await;
    start_and_wait_up(&c, &rados, b).await;
    wait_until(
        &format!("pg {pg} down again"),
        Duration::from_secs(30),
        || pg_state(&c, pg).contains("down"),
    )
    .await;
    let refused = kelp(&["osd", "lost", &a.to_string(), "-c", &c.conf()]);
    assert!(
        !refused.status.success()
            && String::from_utf8_lossy(&refused.stderr).contains("--yes-i-really-mean-it"),
        "osd lost without confirmation: {refused:?}"
    );
    c.cli(&["osd", "lost", &a.to_string(), "--yes-i-really-mean-it"]);
    wait_until(
        &format!("pg {pg} active after osd lost"),
        Duration::from_secs(30),
        || pg_state(&c, pg).starts_with("active"),
    )
    .await;
    // What the operator gave up: v3 (only osd.A had it). B's copy is v2.
    verify(&io, &acked).await;
    let v4 = version(&in_pg, 4);
    write_all(&io, &v4).await;
    acked.extend(v4);
    start_and_wait_up(&c, &rados, a).await;
    wait_until(
        "all PGs active+clean with the lost OSD back",
        Duration::from_secs(60),
        || all_active_clean(&c),
    )
    .await;
    verify(&io, &acked).await;
}
