#!/usr/bin/env bash
# RADOS benchmark of a fresh local Kelp cluster (3 OSDs, size 3), laid out like Ceph's anchor
# (shared/anchors/ceph/bench.sh): 4 MiB write + seq read, 4 KiB write + rand read, -t 16.
# Prints one line per test: rate, p50, daemon CPU (cores, and CPU seconds per GB / per 1000
# ops, from utime+stime of every kelp daemon in /proc/PID/stat before and after the test),
# client CPU and the host load average; then each daemon's RSS and peak RSS.
#
# Usage: scripts/rados-bench.sh DIR [SECONDS]   Env: KELP=path/to/kelp, OSD_SIZE=16GiB (4 MiB
#        writes put up to ~1.2 GB/s on each OSD of a quiet VM: 20 s need ~23 GiB OSDs, 14 s
#        fit in 21 GiB; 3 x OSD_SIZE must be free; a full OSD stops the bench cleanly),
#        PREWRITE=1 (the default: kelp up --prewrite, data files written with zeros up front),
#        PREWRITE=0 (kelp up's default: data files that grow as data arrives),
#        PREWRITE=reserve (kelp up --no-prewrite: data files only reserved, not written),
#        TESTS="w4m r4m w4k r4k" (also: clean = remove the benchmark objects), KEEP=1 (leave the cluster running; otherwise it is stopped
#        and its data directory DIR/kelp deleted, the result files in DIR stay)
set -euo pipefail
{
DIR=${1:?usage: rados-bench.sh DIR [SECONDS]}
DUR=${2:-20}
KELP=${KELP:-$(cd "$(dirname "$0")/.." && pwd)/target/release/kelp}
OSD_SIZE=${OSD_SIZE:-16GiB}
TESTS=${TESTS:-w4m r4m w4k r4k}
TCK=$(getconf CLK_TCK)
mkdir -p "$DIR"
case ${PREWRITE:-1} in
  1) FILES=--prewrite ;;
  0) FILES= ;;
  reserve) FILES=--no-prewrite ;;
  *) echo "PREWRITE must be 1, 0 or reserve" >&2; exit 2 ;;
esac
"$KELP" up --dir "$DIR/kelp" --detach --osd-size "$OSD_SIZE" $FILES >"$DIR/up.log" 2>&1
CONF=$DIR/kelp/kelp.conf
# The cluster's OSD files are up to OSD_SIZE each: remove them at the end (results stay).
[[ ${KEEP:-0} == 1 ]] || trap '"$KELP" down --dir "$DIR/kelp" >/dev/null 2>&1; rm -rf "$DIR/kelp"' EXIT
pids() { cat "$DIR"/kelp/run/*.pid; }
cpu_ticks() { local t=0 p; for p in $(pids); do t=$((t + $(awk '{print $14+$15}' /proc/$p/stat))); done; echo $t; }
run() { # run NAME BYTES_PER_OP ARGS...
  local name=$1 bytes=$2; shift 2
  local c0 c1 out load
  load=$(cut -d' ' -f1-3 /proc/loadavg)
  c0=$(cpu_ticks)
  /usr/bin/time -f "%U %S" -o "$DIR/$name.time" \
    env KELP_CONF="$CONF" "$KELP" rados -p data bench "$DUR" "$@" -t 16 --format json >"$DIR/$name.json" 2>"$DIR/$name.err"
  c1=$(cpu_ticks)
  python3 - "$name" "$bytes" "$c0" "$c1" "$TCK" "$DIR/$name.json" "$DIR/$name.time" "$load" <<'PY'
import json, sys
name, bytes_, c0, c1, tck, js, tm, load = sys.argv[1:]
r = json.load(open(js))
ops, secs = r["ops"], r["seconds"]
cpu = (int(c1) - int(c0)) / float(tck)
client = sum(map(float, open(tm).read().split()[-2:]))
rate = ops / secs
mib = rate * int(bytes_) / 2**20
gb = ops * int(bytes_) / 1e9
p50 = f'{r["latency_ms"]["p50"]:.2f}/{r["latency_ms"]["p99"]:.1f}'
err = f' ERRORS {r["errors"]}' if r["errors"] else ""
print(f"{name}: {rate:9.1f} ops/s {mib:8.1f} MiB/s p50/p99 {p50} ms{err} | daemons {cpu/secs:.2f} cores, "
      f"{cpu/gb:.2f} CPU-s/GB, {cpu/(ops/1000):.3f} CPU-s/kop | client {client/secs:.2f} cores | load {load}")
PY
}
for t in $TESTS; do
  case $t in
    clean) env KELP_CONF="$CONF" "$KELP" rados -p data cleanup >/dev/null 2>&1 || true
           env KELP_CONF="$CONF" "$KELP" health --wait --timeout 120 >/dev/null ;;
    w4m) run write_4m $((4<<20)) write --no-cleanup ;;
    r4m) run seq_4m $((4<<20)) seq ;;
    w4k) env KELP_CONF="$CONF" "$KELP" rados -p data cleanup >/dev/null 2>&1 || true
         # If the 4 MiB writes filled the OSDs, writes resume once the monitors have seen
         # the space freed (OSD_FULL clears): wait up to a minute for that.
         for _ in $(seq 60); do
           env KELP_CONF="$CONF" "$KELP" health detail 2>/dev/null | grep -q " OSD_FULL:" || break
           sleep 1
         done
         run write_4k 4096 write -b 4096 --no-cleanup ;;
    r4k) run rand_4k 4096 rand ;;
  esac
done
for f in "$DIR"/kelp/run/*.pid; do
  p=$(cat "$f"); echo "$(basename "$f" .pid): $(awk '/VmRSS|VmHWM/{printf "%s %d MiB  ", $1, $2/1024}' /proc/$p/status)"
done
exit 0
}
