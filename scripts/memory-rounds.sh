#!/usr/bin/env bash
# OSD memory over time: one cluster, ROUNDS rounds of `rados bench -t 16` (D s of 4 MiB writes,
# D s seq, cleanup, D s of 4 KiB writes whose objects are kept, D s of 4 KiB random reads),
# each OSD's RSS printed after every round. The same load for Kelp and for Ceph 16.2 (the
# anchor's up.sh, a 64-PG replicated pool), so their memory can be compared at equal history.
#
# Usage: scripts/memory-rounds.sh kelp|ceph DIR [ROUNDS]   Env: D=10 (seconds per phase),
#        KELP=path/to/kelp, ANCHOR=path/to/shared/anchors/ceph. DIR is deleted first and after.
set -uo pipefail
MODE=${1:?usage: memory-rounds.sh kelp|ceph DIR [ROUNDS]}
DIR=${2:?usage: memory-rounds.sh kelp|ceph DIR [ROUNDS]}
N=${3:-4}
D=${D:-10}
ROOT=$(cd "$(dirname "$0")/.." && pwd)
KELP=${KELP:-$ROOT/target/release/kelp}
ANCHOR=${ANCHOR:-$ROOT/../shared/anchors/ceph}
rm -rf "$DIR"; mkdir -p "$DIR"
if [[ $MODE == kelp ]]; then
  "$KELP" up --dir "$DIR/k" --detach --osd-size 16GiB --no-rgw >"$DIR/up.log" 2>&1 || { tail "$DIR/up.log"; exit 1; }
  R=(env KELP_CONF="$DIR/k/kelp.conf" "$KELP" rados -p data); RUN=$DIR/k/run
  trap '"$KELP" down --dir "$DIR/k" >/dev/null 2>&1; rm -rf "$DIR/k"' EXIT
else
  ENABLE_MDS=0 ENABLE_RGW=0 "$ANCHOR/up.sh" "$DIR/c" >"$DIR/up.log" 2>&1 || { tail "$DIR/up.log"; exit 1; }
  ceph -c "$DIR/c/ceph.conf" osd pool create bench 64 64 replicated >/dev/null 2>&1
  ceph -c "$DIR/c/ceph.conf" osd pool application enable bench rados >/dev/null 2>&1
  R=(rados -c "$DIR/c/ceph.conf" -p bench); RUN=$DIR/c/run
  trap '"$ANCHOR/down.sh" "$DIR/c" --purge >/dev/null 2>&1; rm -rf "$DIR/c"' EXIT
fi
rss() { for f in "$RUN"/osd.*.pid; do awk '/VmRSS/{printf "%d ", $2/1024}' "/proc/$(cat "$f")/status"; done; }
echo "$MODE start $(date -u +%T) OSD RSS MiB: $(rss)"
for r in $(seq "$N"); do
  "${R[@]}" bench "$D" write -t 16 --no-cleanup >"$DIR/r$r.w4m" 2>&1
  "${R[@]}" bench "$D" seq -t 16 >"$DIR/r$r.r4m" 2>&1
  "${R[@]}" cleanup >/dev/null 2>&1
  "${R[@]}" bench "$D" write -b 4096 -t 16 --no-cleanup >"$DIR/r$r.w4k" 2>&1
  "${R[@]}" bench "$D" rand -t 16 >"$DIR/r$r.r4k" 2>&1
  echo "round $r $(date -u +%T) OSD RSS MiB: $(rss)| 4 MiB write MB/s $(awk '/^Bandwidth \(MB/{print $NF}' "$DIR/r$r.w4m") 4 KiB write IOPS $(awk '/^Average IOPS/{print $NF}' "$DIR/r$r.w4k")"
done
