#!/usr/bin/env bash
# Recovery of an erasure-coded pool after losing one OSD, for Kelp or for Ceph 16.2 (the anchor's
# up.sh/down.sh), on the same layout, one fresh cluster per run:
#   OSDS (7) OSDs, no gateway, no file system; profile ec42 (k=K m=M crush-failure-domain=osd),
#   pool `ecrec` (PG_NUM PGs); FILL objects of 4 MiB written with `rados bench write
#   --max-objects FILL -t 16 --no-cleanup`; every PG active+clean; then osd.KILL is killed
#   (kill -9 of its pid from the cluster's run/osd.N.pid) and marked out at once. With k+m = 6
#   shards on 7 OSDs, the lost shards are rebuilt on the seventh OSD from k survivors each.
#   A 1 Hz sampler (`status` as JSON: pgmap.pgs_by_state, degraded objects, recovery rate)
#   records the PG states until every PG is active+clean again (at most MAX_WAIT s).
#   Afterwards every object is read back whole (`rados bench seq`), which must report no error.
# Figures: recovery_wall (kill to clean), inactive_seconds (samples with a PG neither active nor
# peering-free), degraded_peak, rebuilt_MiBps (the lost OSD's share of the raw data, FILL x 4 MiB
# x (k+m)/k / OSDS, over recovery_wall), readback errors.
# Prints `name value unit` lines; saves them to DIR/out/summary.txt; samples in DIR/out/samples.jsonl.
# Usage: scripts/ec-recovery-bench.sh DIR [kelp|ceph]
# Env: OSDS=7 K=4 M=2 PG_NUM=64 FILL=512 KILL=OSDS-1 MAX_WAIT=900 OSD_SIZE=8GiB (Kelp; Ceph's
#      OSD_SIZE_GB=20 from up.sh) KELP=target/release/kelp CEPH_ANCHOR=../shared/anchors/ceph
set -uo pipefail
{  # whole script in one block: bash reads it fully before running it
DIR=${1:?usage: ec-recovery-bench.sh DIR [kelp|ceph]}
SYS=${2:-kelp}
mkdir -p "$DIR"; DIR=$(cd "$DIR" && pwd)
HERE=$(cd "$(dirname "$0")" && pwd)
OSDS=${OSDS:-7}
K=${K:-4}
M=${M:-2}
PG_NUM=${PG_NUM:-64}
FILL=${FILL:-512}
KILL=${KILL:-$((OSDS - 1))}
MAX_WAIT=${MAX_WAIT:-900}
OSD_SIZE=${OSD_SIZE:-8GiB}
CD=$DIR/cluster; OUT=$DIR/out
rm -rf "$OUT"; mkdir -p "$OUT"
SUM=$OUT/summary.txt; : > "$SUM"
note() { echo "# $*" | tee -a "$SUM"; }
emit() { echo "$1 $2 $3" | tee -a "$SUM"; }
(( OSDS > K + M )) || { echo "OSDS=$OSDS: a spare OSD beyond k+m=$((K + M)) is needed to rebuild onto" >&2; exit 2; }

case $SYS in
  kelp)
    KELP=${KELP:-$HERE/../target/release/kelp}
    [[ -x $KELP ]] || { echo "no kelp binary at $KELP (cargo build --release -p kelp)"; exit 1; }
    CLI() { "$KELP" -c "$CD/kelp.conf" "$@"; }
    RADOS() { "$KELP" -c "$CD/kelp.conf" rados "$@"; }
    STATUS() { CLI status --format json; }
    up() {
      "$KELP" up --dir "$CD" --detach --osds "$OSDS" --osd-size "$OSD_SIZE" --pg-num 8 --no-rgw --no-fs \
        --timeout-secs 600 > "$OUT/up.log" 2>&1
    }
    down() { "$KELP" down --dir "$CD" > "$OUT/down.log" 2>&1; rm -rf "$CD"; }
    mkpool() {
      CLI osd erasure-code-profile set ec42 k="$K" m="$M" crush-failure-domain=osd &&
        CLI pool create ecrec "$PG_NUM" --erasure ec42
    }
    version() { "$KELP" --version; } ;;
  ceph)
    ANCHOR=${CEPH_ANCHOR:-$HERE/../../shared/anchors/ceph}
    [[ -x $ANCHOR/up.sh ]] || { echo "no Ceph anchor at $ANCHOR (set CEPH_ANCHOR)"; exit 1; }
    CLI() { ceph -c "$CD/ceph.conf" "$@"; }
    RADOS() { rados -c "$CD/ceph.conf" "$@"; }
    STATUS() { CLI status -f json; }
    up() { NUM_OSD=$OSDS ENABLE_RGW=0 ENABLE_MDS=0 "$ANCHOR/up.sh" "$CD" > "$OUT/up.log" 2>&1; }
    down() { "$ANCHOR/down.sh" "$CD" --purge > "$OUT/down.log" 2>&1; }
    mkpool() {
      CLI osd pool rm bench bench --yes-i-really-really-mean-it >/dev/null 2>&1
      CLI osd pool rm rbd rbd --yes-i-really-really-mean-it >/dev/null 2>&1
      CLI osd erasure-code-profile set ec42 k="$K" m="$M" crush-failure-domain=osd &&
        CLI osd pool create ecrec "$PG_NUM" "$PG_NUM" erasure ec42 &&
        CLI osd pool application enable ecrec rados
    }
    version() { ceph --version; } ;;
  *) echo "usage: ec-recovery-bench.sh DIR [kelp|ceph]" >&2; exit 2 ;;
esac

# clean [SECONDS]: waits until every PG is active+clean
clean() {
  local n
  for n in $(seq "${1:-300}"); do
    STATUS 2>/dev/null | python3 -c '
import json, sys
p = json.load(sys.stdin)["pgmap"]
st = {s["state_name"]: s["count"] for s in p["pgs_by_state"]}
sys.exit(0 if p["num_pgs"] > 0 and st.get("active+clean", 0) == p["num_pgs"] else 1)' && return 0
    sleep 1
  done
  return 1
}

note "ec recovery $SYS $(version | head -1) $(date -u +%FT%TZ) commit=$(git -C "$HERE/.." rev-parse --short HEAD 2>/dev/null) host=$(nproc)cpu osds=$OSDS k=$K m=$M pg_num=$PG_NUM fill=${FILL}x4MiB kill=osd.$KILL load=$(cut -d' ' -f1-3 /proc/loadavg)"
up || { note "bringing the cluster up failed, see $OUT/up.log"; tail -n 20 "$OUT/up.log"; down; exit 1; }
trap down EXIT
mkpool > "$OUT/pool.txt" 2>&1 || { note "pool creation failed: $(cat "$OUT/pool.txt")"; exit 1; }
clean 300 || { note "PGs not active+clean after the pool was created"; exit 1; }
T=$(date +%s)
RADOS -p ecrec bench 900 write -t 16 --no-cleanup --max-objects "$FILL" > "$OUT/fill.log" 2>&1 \
  || { note "fill failed: $(tail -n 3 "$OUT/fill.log")"; exit 1; }
emit fill_wall "$(( $(date +%s) - T ))" s
clean 300 || { note "PGs not active+clean after the fill"; exit 1; }
sleep 5

VPID=$(cat "$CD/run/osd.$KILL.pid")
STOP=$OUT/stop; rm -f "$STOP"
case $SYS in
  kelp) SCMD=("$KELP" -c "$CD/kelp.conf" status --format json) ;;
  ceph) SCMD=(ceph -c "$CD/ceph.conf" status -f json) ;;
esac
python3 - "$OUT/samples.jsonl" "$STOP" "${SCMD[@]}" <<'EOF' &
import json, os, subprocess, sys, time
out, stop, cmd = sys.argv[1], sys.argv[2], sys.argv[3:]
t0 = time.time()
with open(out, "w") as f:
    while not os.path.exists(stop):
        t = time.time()
        try:
            p = json.loads(subprocess.run(cmd, capture_output=True, timeout=20).stdout)["pgmap"]
            f.write(json.dumps({"t": round(t - t0, 2), "num_pgs": p["num_pgs"],
                                "states": {s["state_name"]: s["count"] for s in p["pgs_by_state"]},
                                "degraded": p.get("degraded_objects", 0),
                                "recovering_Bps": p.get("recovering_bytes_per_sec", 0)}) + "\n")
        except Exception as e:
            f.write(json.dumps({"t": round(t - t0, 2), "error": str(e)}) + "\n")
        f.flush()
        time.sleep(max(0.0, 1.0 - (time.time() - t)))
EOF
SAMPLER=$!
T0=$(date +%s.%N)
kill -9 "$VPID"
CLI osd out "$KILL" > "$OUT/out.txt" 2>&1
note "killed osd.$KILL (pid $VPID) and marked it out"
sleep 3
if clean "$MAX_WAIT"; then
  T1=$(date +%s.%N); ok=1
else
  T1=$(date +%s.%N); ok=0; note "not clean within $MAX_WAIT s"
fi
touch "$STOP"; wait "$SAMPLER" 2>/dev/null
python3 - "$OUT/samples.jsonl" "$T0" "$T1" "$ok" "$FILL" "$K" "$M" "$OSDS" <<'EOF' | tee -a "$SUM"
import json, sys
path, t0, t1, ok, fill, k, m, osds = sys.argv[1:9]
wall = float(t1) - float(t0)
rows = [json.loads(l) for l in open(path) if l.strip()]
rows = [r for r in rows if "states" in r]
inactive = sum(1 for r in rows if any("active" not in s.split("+") for s in r["states"]))
peak = max((r["degraded"] for r in rows), default=0)
lost = int(fill) * 4 * (int(k) + int(m)) / int(k) / int(osds)
print(f"recovery_wall {wall:.1f} s" if ok == "1" else f"recovery_wall >{wall:.0f} s")
print(f"inactive_seconds {inactive} s")
print(f"degraded_peak {peak} objects")
print(f"rebuilt_MiBps {lost / wall:.1f} MiB/s")
EOF
T=$(date +%s)
RADOS -p ecrec bench 900 seq -t 16 > "$OUT/readback.log" 2>&1; rc=$?
errs=$(grep -ciE "error|expected" "$OUT/readback.log")
emit readback_exit "$rc" code
emit readback_error_lines "$errs" lines
emit readback_wall "$(( $(date +%s) - T ))" s
}
