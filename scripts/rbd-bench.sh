#!/usr/bin/env bash
# Block benchmark of a fresh local Kelp cluster (3 OSDs, size 3), laid out like Ceph's anchor
# (shared/anchors/ceph/bench.sh, its "rbd" and "fio" groups): a 2 GiB image in pool `rbd`;
# `kelp rbd bench` 4 MiB sequential writes over the whole image then sequential reads (16
# threads; the reads make READ_PASSES passes over the image, so that they last long enough
# to be timed); fio through the NBD server (`--ioengine=nbd`, the path every NBD client
# takes): 4 KiB random writes, 4 KiB random reads, 4 MiB sequential reads, at iodepth 16 for
# DUR seconds each (2 s ramp). Prints one line per test with the rate, p50/p99 latency and
# the daemons' CPU per op.
#
# Usage: scripts/rbd-bench.sh DIR [DUR]   Env: KELP=path/to/kelp, OSD_SIZE=6GiB, SIZE=2G,
#        READ_PASSES=4, TESTS="seqwrite seqread randwrite randread nbdseqread" (a subset
#        runs just those after seqwrite, which always runs: it fills the image),
#        KEEP=1 (leave the cluster running; otherwise it is stopped and DIR/kelp deleted)
set -euo pipefail
DIR=${1:?usage: rbd-bench.sh DIR [DUR]}
DUR=${2:-20}
KELP=${KELP:-$(cd "$(dirname "$0")/.." && pwd)/target/release/kelp}
OSD_SIZE=${OSD_SIZE:-6GiB}
SIZE=${SIZE:-2G}
READ_PASSES=${READ_PASSES:-4}
TESTS=${TESTS:-seqwrite seqread randwrite randread nbdseqread}
TCK=$(getconf CLK_TCK)
mkdir -p "$DIR"
"$KELP" up --dir "$DIR/kelp" --detach --osd-size "$OSD_SIZE" --prewrite --no-rgw >"$DIR/up.log" 2>&1
[[ ${KEEP:-0} == 1 ]] || trap '"$KELP" down --dir "$DIR/kelp" >/dev/null 2>&1; rm -rf "$DIR/kelp"' EXIT
CONF=$DIR/kelp/kelp.conf
K() { "$KELP" -c "$CONF" "$@"; }
cpu_ticks() { local t=0 p; for p in $(cat "$DIR"/kelp/run/*.pid); do t=$((t + $(awk '{print $14+$15}' /proc/$p/stat))); done; echo $t; }
K rbd create img --size "$SIZE"
URI=nbd://$(cat "$DIR/kelp/nbd.0/addr")/rbd/img
BYTES=$(K rbd info img --format json | python3 -c 'import json,sys;print(json.load(sys.stdin)["size"])')

rbdbench() { # NAME ARGS...
  local name=$1; shift
  local c0 c1 out
  c0=$(cpu_ticks)
  out=$(K rbd bench img --io-threads 16 "$@" | tee "$DIR/$name.log" | tail -1)
  c1=$(cpu_ticks)
  python3 - "$name" "$out" "$c0" "$c1" "$TCK" <<'PY'
import re, sys
name, out, c0, c1, tck = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5])
el = float(re.search(r"elapsed: ([\d.]+)", out).group(1))
ops = int(re.search(r"ops: (\d+)", out).group(1))
p50 = float(re.search(r"p50: ([\d.]+)", out).group(1)); p99 = float(re.search(r"p99: ([\d.]+)", out).group(1))
cpu = (c1 - c0) / tck
print(f"{name}: {ops/el:9.1f} ops/s {ops*4/el:8.1f} MiB/s ({ops} ops in {el:.1f} s) p50/p99 {p50:.2f}/{p99:.2f} ms | daemons {cpu/el:.2f} cores, {cpu/ops*1000:.3f} CPU-ms/op")
PY
}
fiobench() { # NAME RW [BS]
  local name=$1 rw=$2 bs=${3:-4k} c0 c1
  c0=$(cpu_ticks)
  fio --name="$name" --ioengine=nbd --uri="$URI" --rw="$rw" --bs="$bs" --iodepth=16 --numjobs=1 \
    --size="$BYTES" --runtime="$DUR" --time_based --ramp_time=2 --lat_percentiles=1 \
    --group_reporting --output-format=json >"$DIR/$name.json"
  c1=$(cpu_ticks)
  python3 - "$name" "$DIR/$name.json" "${rw#rand}" "$c0" "$c1" "$TCK" "$DUR" <<'PY'
import json, sys
name, path, rw, c0, c1, tck, dur = sys.argv[1:8]
t = open(path).read()
j = json.loads(t[t.index("{"):])["jobs"][0][rw]
iops = j["iops"]; lat = j["lat_ns"]["percentile"]
cpu = (int(c1) - int(c0)) / int(tck)
print(f"{name}: {iops:9.1f} IOPS {j['bw_bytes']/2**20:8.1f} MiB/s p50/p99 {lat['50.000000']/1e6:.2f}/{lat['99.000000']/1e6:.2f} ms | daemons {cpu/(float(dur)+2):.2f} cores, {cpu/(iops*(float(dur)+2))*1000:.3f} CPU-ms/op")
PY
}
has() { [[ " $TESTS " == *" $1 "* ]]; }
rbdbench rbd_4m_seqwrite --io-type write --io-size 4M --io-pattern seq --io-total "$BYTES"
has seqread && rbdbench rbd_4m_seqread --io-type read --io-size 4M --io-pattern seq \
  --io-total $((BYTES * READ_PASSES))
has randwrite && fiobench fio_nbd_4k_randwrite randwrite
has randread && fiobench fio_nbd_4k_randread randread
has nbdseqread && fiobench fio_nbd_4m_seqread read 4M
for p in "$DIR"/kelp/run/*.pid; do
  n=$(basename "$p" .pid); echo "$n: $(grep -E 'VmHWM|VmRSS' /proc/$(cat "$p")/status | tr -s ' \n' ' ')"
done
