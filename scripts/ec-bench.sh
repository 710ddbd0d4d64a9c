#!/usr/bin/env bash
# Erasure-coding benchmark of a fresh local Kelp cluster, the counterpart of Ceph's anchor
# ../shared/anchors/ceph/ec.sh (Ceph 16.2, 6 OSDs, a 4+2 pool, `rados bench -t 16`).
#   `kelp up --osds OSDS --osd-size OSD_SIZE --pg-num PG_NUM --no-rgw --prewrite --detach`;
#   profile ec42 (k=K m=M crush-failure-domain=osd), pool `ecpool` (PG_NUM PGs, erasure ec42);
#   wait until every PG is active+clean (`kelp health --wait`); then `kelp rados bench`, DUR s each:
#   4 MiB objects: write (--no-cleanup), seq read with fast_read 0 and 1, rand read with
#     fast_read 1 and 0 (ec.sh's order); then 4 KiB overwrites at random aligned offsets inside
#     those 4 MiB objects (`bench overwrite -b 4096`; Ceph 16 needs allow_ec_overwrites for this,
#     ec.sh does not measure it); the 4 MiB objects are then removed (`rados cleanup`);
#   4 KiB objects: write, rand read with fast_read 0 and 1;
#   REP=1: the same 4 MiB write/rand, 4 KiB overwrites and 4 KiB write/rand on the replicated
#     size-3 pool `data` (PG_NUM PGs) of the same cluster, for comparison (the 4 MiB objects
#     removed before the 4 KiB ones are written);
#   raw space: a fresh EC pool `ecspace` gets exactly SPACE_OBJS objects of 4 KiB
#     (`bench write -b 4096 --max-objects`); raw used = growth of the OSDs' allocated data
#     (`kelp osd df`, sum of USE) once every PG has reported them; metadata = growth of the
#     OSDs' meta/ directories (`du`); ratio = raw used / (SPACE_OBJS x 4096) (the bench's own
#     object list, benchmark_last_metadata, is removed first);
#   per-daemon RSS (VmRSS / VmHWM), then `kelp down` and the cluster directory is deleted.
# 4 MiB writes are capped with --max-objects so that the data fits: 70 % of the raw capacity.
# A test whose bench exits non-zero, times out (DUR + 120 s) or reports errors gives no figure:
# a `# FAILED` / `# ERRORS` line instead, and the last 40 lines of every OSD log in
# DIR/out/fail_NAME.txt.
# Prints `name value unit` lines (ec.sh's names where they apply) and saves them to
# DIR/out/summary.txt; raw output (bench JSON, osd df, pg ls) in DIR/out.
# Usage: scripts/ec-bench.sh DIR [SECONDS]
# Env: KELP=target/release/kelp OSDS=6 OSD_SIZE=8GiB PG_NUM=64 K=4 M=2 REP=1 SPACE_OBJS=10000
#      PREWRITE=1 (0: files that grow as data arrives) TESTS="ec4m ow ec4k rep space" KEEP=0
set -uo pipefail
{  # whole script in one block: bash reads it fully before running it
DIR=${1:?usage: ec-bench.sh DIR [SECONDS]}
DUR=${2:-${DUR:-20}}
mkdir -p "$DIR"; DIR=$(cd "$DIR" && pwd)
HERE=$(cd "$(dirname "$0")" && pwd)
KELP=${KELP:-$HERE/../target/release/kelp}
KELP=$(cd "$(dirname "$KELP")" && pwd)/$(basename "$KELP")
OSDS=${OSDS:-6}
OSD_SIZE=${OSD_SIZE:-8GiB}
PG_NUM=${PG_NUM:-64}
K=${K:-4}
M=${M:-2}
REP=${REP:-1}
SPACE_OBJS=${SPACE_OBJS:-10000}
TESTS=${TESTS:-ec4m ow ec4k rep space}
KEEP=${KEEP:-0}
case ${PREWRITE:-1} in 1) FILES=--prewrite ;; 0) FILES= ;; *) echo "PREWRITE must be 1 or 0" >&2; exit 2 ;; esac
[[ -x $KELP ]] || { echo "no kelp binary at $KELP (cargo build --release -p kelp)"; exit 1; }
# the OSD files take OSDS x OSD_SIZE (prewritten: at once): refuse to start rather than fill a shared disk
python3 - "$DIR" "$OSD_SIZE" "$OSDS" <<'EOF' || exit 1
import os, re, sys
d, size, n = sys.argv[1], sys.argv[2], int(sys.argv[3])
m = re.fullmatch(r'(\d+(?:\.\d+)?)\s*([KMGT]i?B?)?', size.strip(), re.I)
if not m:
    sys.exit(f"OSD_SIZE={size}: use e.g. 8GiB")
osd = float(m.group(1)) * {'K': 2**10, 'M': 2**20, 'G': 2**30, 'T': 2**40}.get((m.group(2) or 'B')[0].upper(), 1)
st = os.statvfs(d); free = st.f_bavail * st.f_frsize; need = n * osd + 2 * 2**30
if free < need:
    sys.exit(f"not enough free disk in {d}: {free/2**30:.1f} GiB, need {need/2**30:.1f} GiB ({n} x OSD_SIZE {size} + 2 GiB); lower OSD_SIZE")
EOF
CD=$DIR/kelp; OUT=$DIR/out; CONF=$CD/kelp.conf
rm -rf "$OUT"; mkdir -p "$OUT"
SUM=$OUT/summary.txt; : > "$SUM"
TCK=$(getconf CLK_TCK)
export KELP_CONF=$CONF
KL() { "$KELP" "$@"; }
emit() { echo "$1 $2 $3" | tee -a "$SUM"; }
note() { echo "# $*" | tee -a "$SUM"; }
# 4 MiB objects that fit in 70 % of the raw capacity, at a raw cost of COST_TENTHS/10 per byte
cap4m() {
  python3 - "$OSD_SIZE" "$OSDS" "$1" <<'EOF'
import re, sys
size, n, cost = sys.argv[1], int(sys.argv[2]), float(sys.argv[3]) / 10
m = re.fullmatch(r'(\d+(?:\.\d+)?)\s*([KMGT]i?B?)?', size.strip(), re.I)
mult = {'K': 2**10, 'M': 2**20, 'G': 2**30, 'T': 2**40}.get((m.group(2) or 'B')[0].upper(), 1)
print(int(0.7 * n * float(m.group(1)) * mult / cost / 2**22))
EOF
}
daemon_cpu() {
  local t=0 p f
  for f in "$CD"/run/*.pid; do
    p=$(cat "$f" 2>/dev/null) || continue
    [[ -r /proc/$p/stat ]] || continue
    t=$(( t + $(awk '{print $14+$15}' "/proc/$p/stat") ))
  done
  echo "$t"
}
host_busy() { awk '/^cpu /{print $2+$3+$4+$7+$8+$9}' /proc/stat; }
osd_tails() {  # osd_tails FILE: the last 40 lines of every OSD log
  local f
  for f in "$CD"/logs/osd.*.log; do echo "=== $f"; tail -n 40 "$f"; done > "$1" 2>&1
  note "last 40 lines of every OSD log in $1"
}
# phase NAME POOL BENCH-ARGS... : kelp rados -p POOL bench DUR BENCH-ARGS -t 16 --format json,
# output in $OUT/NAME.json (stderr $OUT/NAME.err); rate, latency and CPU (cores) as ec.sh's lines
phase() {
  local name=$1 pool=$2; shift 2
  local d0 h0 t0 d1 h1 t1 rc load
  load=$(cut -d' ' -f1-3 /proc/loadavg)
  d0=$(daemon_cpu); h0=$(host_busy); t0=$(date +%s.%N)
  /usr/bin/time -f "%U %S" -o "$OUT/$name.time" timeout -s INT -k 10 $((DUR + 120)) \
    "$KELP" rados -p "$pool" bench "$DUR" "$@" -t 16 --format json >"$OUT/$name.json" 2>"$OUT/$name.err"
  rc=$?
  d1=$(daemon_cpu); h1=$(host_busy); t1=$(date +%s.%N)
  echo "kelp rados -p $pool bench $DUR $* -t 16 --format json  (exit $rc, load before: $load)" > "$OUT/$name.cmd"
  if [[ $rc != 0 ]]; then
    note "$name: FAILED, exit $rc$( [[ $rc == 124 || $rc == 137 ]] && echo ' (timed out)'): kelp rados -p $pool bench $DUR $* -t 16"
    sed 's/^/#   /' "$OUT/$name.err" | tail -n 20 | tee -a "$SUM"
    osd_tails "$OUT/fail_$name.txt"
    return 1
  fi
  python3 - "$name" "$OUT/$name.json" "$d0" "$d1" "$h0" "$h1" "$t0" "$t1" "$OUT/$name.time" "$TCK" "$load" <<'EOF' | tee -a "$SUM"
import json, sys
n, path, d0, d1, h0, h1, t0, t1, tf, tck, load = sys.argv[1:]
try:
    r = json.load(open(path))
except Exception as e:
    print(f"# {n}: FAILED, no JSON summary in {path} ({e})"); sys.exit(0)
if r.get("errors"):
    print(f"# {n}: ERRORS {r['errors']} of {r['ops']} ops: not a figure")
elif r["ops"] == 0 or r["seconds"] <= 0:
    print(f"# {n}: no operation finished: not a figure")
else:
    ops, secs, size = r["ops"], r["seconds"], r["object_size"]
    print(f"{n}_MiBps {ops * size / secs / 2**20:.1f} MiB/s"); print(f"{n}_ops {ops / secs:.1f} ops/s")
    print(f"{n}_lat_avg {r['latency_ms']['avg']:.2f} ms"); print(f"{n}_lat_p99 {r['latency_ms']['p99']:.1f} ms")
    print(f"{n}_run {secs:.1f} s")
wall = float(t1) - float(t0); tck = float(tck)
try:
    cl = sum(map(float, open(tf).read().split()[-2:]))
except Exception:
    cl = 0.0
dm = (int(d1) - int(d0)) / tck; host = (int(h1) - int(h0)) / tck
print(f"{n}_cpu_daemons {dm/wall:.2f} cores"); print(f"{n}_cpu_client {cl/wall:.2f} cores")
print(f"{n}_cpu_other {max(0.0, host-dm-cl)/wall:.2f} cores")
print(f"# {n}: load average before {load}")
EOF
}
fr() { KL pool set ecpool fast_read "$1" >/dev/null 2>&1 || note "pool set ecpool fast_read $1 failed"; }
cleanup() {  # cleanup POOL: remove the bench objects, wait until the PGs are clean
  local t0=$(date +%s)
  timeout 600 "$KELP" rados -p "$1" cleanup >"$OUT/cleanup_$1.log" 2>&1 || note "cleanup of $1 failed: $(tail -n 3 "$OUT/cleanup_$1.log")"
  KL health --wait --timeout 300 >/dev/null 2>&1 || note "not clean after the cleanup of $1: $(KL health detail 2>&1 | head -5)"
  note "cleanup of $1: $(( $(date +%s) - t0 )) s"
}
osd_used_kb() { KL osd df --format json | python3 -c 'import json,sys; print(json.load(sys.stdin)["summary"]["total_kb_used"])'; }
meta_kb() { du -sk "$CD"/osd.*/meta | awk '{s+=$1} END {print s}'; }
pool_objects() { KL pg ls --pool "$1" --format json | python3 -c 'import json,sys; print(sum(p["num_objects"] for p in json.load(sys.stdin)["pg_stats"]))'; }

T0=$(date +%s)
note "kelp ec k=$K m=$M $(date -u +%FT%TZ) commit=$(git -C "$HERE/.." rev-parse --short HEAD 2>/dev/null) host=$(nproc)cpu osds=$OSDS osd_size=$OSD_SIZE pg_num=$PG_NUM DUR=${DUR}s ${FILES:-grown files} load=$(cut -d' ' -f1-3 /proc/loadavg)"
KL up --dir "$CD" --detach --osds "$OSDS" --osd-size "$OSD_SIZE" --pg-num "$PG_NUM" --no-rgw $FILES --timeout-secs 600 \
  > "$OUT/up.log" 2>&1 || { note "kelp up failed, see $OUT/up.log"; tail -n 20 "$OUT/up.log"; KL down --dir "$CD" >/dev/null 2>&1; exit 1; }
[[ $KEEP == 1 ]] || trap '"$KELP" down --dir "$CD" > "$OUT/down.log" 2>&1; rm -rf "$CD"' EXIT
emit up_wall "$(( $(date +%s) - T0 ))" s
KL osd erasure-code-profile set ec42 k="$K" m="$M" crush-failure-domain=osd > "$OUT/ec_profile.txt" 2>&1
KL osd erasure-code-profile get ec42 >> "$OUT/ec_profile.txt" 2>&1
KL pool create ecpool "$PG_NUM" --erasure ec42 > "$OUT/pool_create.txt" 2>&1 || { note "pool create failed: $(cat "$OUT/pool_create.txt")"; exit 1; }
KL health --wait --timeout 300 > "$OUT/health.txt" 2>&1 || { note "PGs not active+clean: $(head -5 "$OUT/health.txt")"; exit 1; }
KL pool ls detail > "$OUT/pools.txt" 2>&1
sed 's/^/# profile: /' "$OUT/ec_profile.txt" | tee -a "$SUM"
sed 's/^/# /' "$OUT/pools.txt" | tee -a "$SUM"
EC_CAP=$(cap4m $(( 10 * (K + M) / K ))); REP_CAP=$(cap4m 30)

for t in $TESTS; do
  case $t in
    ec4m)
      fr 0
      phase ec_4m_write   ecpool write --no-cleanup --max-objects "$EC_CAP"
      phase ec_4m_seq_fr0 ecpool seq
      fr 1
      phase ec_4m_seq_fr1  ecpool seq
      phase ec_4m_rand_fr1 ecpool rand
      fr 0
      phase ec_4m_rand_fr0 ecpool rand ;;
    ow)   # 4 KiB writes at random offsets inside the 4 MiB objects (partial stripes)
      fr 0
      phase ec_4k_overwrite ecpool overwrite -b 4096
      cleanup ecpool ;;
    ec4k)
      fr 0
      phase ec_4k_write    ecpool write -b 4096 --no-cleanup
      phase ec_4k_rand_fr0 ecpool rand
      fr 1
      phase ec_4k_rand_fr1 ecpool rand
      fr 0 ;;
    rep)
      [[ $REP == 1 ]] || continue
      phase rep3_4m_write data write --no-cleanup --max-objects "$REP_CAP"
      phase rep3_4m_rand  data rand
      phase rep3_4k_overwrite data overwrite -b 4096
      cleanup data
      phase rep3_4k_write data write -b 4096 --no-cleanup
      phase rep3_4k_rand  data rand ;;
    space)  # raw space of SPACE_OBJS 4 KiB objects in a fresh EC pool
      KL pool create ecspace "$PG_NUM" --erasure ec42 >/dev/null 2>&1
      KL health --wait --timeout 300 >/dev/null 2>&1
      sleep 5
      u0=$(osd_used_kb); m0=$(meta_kb)
      KL osd df > "$OUT/osd_df_before_space.txt" 2>&1
      timeout 900 "$KELP" rados -p ecspace bench 900 write -b 4096 --max-objects "$SPACE_OBJS" --no-cleanup -t 16 --format json \
        > "$OUT/space_write.json" 2> "$OUT/space_write.err"
      rc=$?
      if [[ $rc != 0 ]] || ! python3 -c 'import json,sys; r=json.load(open(sys.argv[1])); sys.exit(1 if r["errors"] else 0)' "$OUT/space_write.json"; then
        note "space: the write of $SPACE_OBJS objects FAILED (exit $rc): $(tail -c 300 "$OUT/space_write.json" "$OUT/space_write.err" | tr '\n' ' ')"
        osd_tails "$OUT/fail_space.txt"
        continue
      fi
      # the object list the bench keeps (benchmark_last_metadata) is not one of the objects
      KL rados -p ecspace rm benchmark_last_metadata >/dev/null 2>&1 || note "could not remove benchmark_last_metadata"
      # wait until every PG has reported its objects and the OSDs' usage stays put
      n=0; prev=-1
      for _ in $(seq 90); do
        n=$(pool_objects ecspace); u1=$(osd_used_kb)
        [[ $n == "$SPACE_OBJS" && $u1 == "$prev" ]] && break
        prev=$u1; sleep 2
      done
      m1=$(meta_kb)
      KL osd df > "$OUT/osd_df_after_space.txt" 2>&1
      KL pg ls --pool ecspace > "$OUT/pg_ls_space.txt" 2>&1
      python3 - "$SPACE_OBJS" "$n" "$u0" "$u1" "$m0" "$m1" <<'EOF' | tee -a "$SUM"
import sys
want, n, u0, u1, m0, m1 = map(int, sys.argv[1:])
logical = want * 4096
print(f"ecspace_objects {n} objects")
print(f"ecspace_stored {logical / 2**20:.1f} MiB")
print(f"ecspace_used_raw {(u1 - u0) / 1024:.1f} MiB")
print(f"ecspace_raw_ratio {(u1 - u0) * 1024 / logical:.2f} x")
print(f"ecspace_raw_per_object {(u1 - u0) / want:.1f} KiB")
print(f"ecspace_meta_growth {(m1 - m0) / 1024:.1f} MiB")
EOF
      ;;
    *) note "unknown test $t" ;;
  esac
done
KL health detail > "$OUT/health_after.txt" 2>&1
KL status > "$OUT/status_after.txt" 2>&1
KL osd df > "$OUT/osd_df_after.txt" 2>&1
for f in "$CD"/run/*.pid; do
  n=$(basename "$f" .pid); p=$(cat "$f")
  [[ -r /proc/$p/status ]] || { note "$n (pid $p) is not running"; continue; }
  emit "rss_$n" "$(awk '/^VmRSS/{printf "%.0f", $2/1024}' /proc/$p/status)" MiB
  emit "rss_peak_$n" "$(awk '/^VmHWM/{printf "%.0f", $2/1024}' /proc/$p/status)" MiB
done
emit ec_total_wall "$(( $(date +%s) - T0 ))" s
exit 0
}
