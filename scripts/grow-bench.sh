#!/usr/bin/env bash
# Large writes on OSD data files that grow (kelp up's default) against files written with
# zeros up front (kelp up --prewrite): two clusters side by side (3 OSDs, size 3, no gateway),
# ROUNDS rounds of `kelp rados bench write` (4 MiB objects, 16 in flight) of the same number of
# objects on each, alternating, with the objects removed after each round. Round 1 on the
# growing cluster includes the growth (zeros written ahead of the data); later rounds reuse
# space already grown, which is what "as fast as a prewritten file" is about.
#
# Usage: scripts/grow-bench.sh DIR    Env: KELP=path/to/kelp, OSD_SIZE=8GiB, OBJS=500 (per
#        round: OBJS x 4 MiB on every OSD), ROUNDS=3. Needs 3 x OSD_SIZE + 3 x OBJS x 4 MiB free.
set -euo pipefail
DIR=${1:?usage: grow-bench.sh DIR}
KELP=${KELP:-$(cd "$(dirname "$0")/.." && pwd)/target/release/kelp}
OSD_SIZE=${OSD_SIZE:-8GiB}
OBJS=${OBJS:-500}
ROUNDS=${ROUNDS:-3}
mkdir -p "$DIR"
trap '"$KELP" down --dir "$DIR/prewritten" >/dev/null 2>&1; "$KELP" down --dir "$DIR/grown" >/dev/null 2>&1; rm -rf "$DIR/prewritten" "$DIR/grown"' EXIT
"$KELP" up --dir "$DIR/prewritten" --detach --no-rgw --osd-size "$OSD_SIZE" --prewrite >/dev/null
"$KELP" up --dir "$DIR/grown" --detach --no-rgw --osd-size "$OSD_SIZE" >/dev/null
frontier() { # MiB of osd.0's data file written so far (growing files only)
  python3 - "$1/osd.0/superblock" <<'PY'
import json, sys
b = open(sys.argv[1], "rb").read()
w = json.loads(b[16:-4]).get("data_written")
print("-" if w is None else w >> 20)
PY
}
for round in $(seq "$ROUNDS"); do
  for c in grown prewritten; do
    conf=$DIR/$c/kelp.conf
    load=$(cut -d' ' -f1 /proc/loadavg)
    "$KELP" -c "$conf" rados -p data bench 300 write -t 16 --max-objects "$OBJS" --no-cleanup -f json \
      >"$DIR/$c.$round.json" 2>/dev/null
    python3 - "$DIR/$c.$round.json" "$round" "$c" "$(frontier "$DIR/$c")" "$load" <<'PY'
import json, sys
r = json.load(open(sys.argv[1]))
rnd, c, w, load = sys.argv[2:]
print(f"round {rnd} {c:10s} {r['ops'] * 4 / r['seconds']:7.1f} MiB/s  p50 {r['latency_ms']['p50']:6.1f} ms"
      f"  osd.0 written to {w} MiB  load {load}")
PY
    "$KELP" -c "$conf" rados -p data cleanup >/dev/null 2>&1
    "$KELP" -c "$conf" health --wait --timeout 120 >/dev/null
  done
done
