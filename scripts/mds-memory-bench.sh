#!/usr/bin/env bash
# MDS memory (RSS) as the number of cached inodes grows, Kelp (default) or Ceph 16.2, on a fresh
# cluster. Ceph: the anchor's up.sh (no rgw; MDS a with its defaults: mds_cache_memory_limit 4 GiB,
# far above what these counts take), ceph-fuse, cached inodes from the MDS's `perf dump`
# (mds.inodes, over its admin socket). Kelp:
#   `kelp up` (3 OSDs, file system kelpfs); its mds.a and mds.b are stopped and one MDS, mds.a,
#   is run by this script with `--cache-inodes CACHE` (default 1 100 000, above the largest
#   count, so every created inode stays cached; the MDS's own default budget is 100 000), one
#   `kelp fs mount`. PROCS parallel python creators make empty files (mknod: one lookup and one
#   create per file, no open/release) through the mount (each in
#   its own directories of 10 000 files) until the file system holds each count of STEPS; after
#   each step the creators stop, the script waits one checkpoint interval plus a second, then
#   records the MDS's VmRSS (/proc/PID/status), its cached-inode count and its backlog of
#   journaled updates not yet written back (`cached_inodes` and `unwritten_updates` of the
#   virtual xattr `kelp.mds.stats` on the mount's root; the MDS runs with its default
#   `--max-backlog`).
# Figures per step: rss_at_N (MiB), cached_at_N (inodes the MDS reports cached),
# unwritten_at_N (Kelp only: updates journaled and not yet written back by a checkpoint),
# bytes_per_inode_at_N ((RSS(N) - RSS(0)) / (cached(N) - cached(0))), create_rate_N (files/s of
# that step). Steps that would start after MAX_SECS seconds of creating are skipped (and said so).
# Prints `name value unit` lines; saves them to DIR/out/summary.txt.
# Usage: scripts/mds-memory-bench.sh DIR [kelp|ceph]
# Env: STEPS="100000 250000 500000 1000000"  PROCS=32  CACHE=1100000  MAX_SECS=1500
#      TERM_SECS=120 (Kelp: how long the stopped MDS may take to exit before it is killed)
#      KELP=target/release/kelp  CEPH_ANCHOR=../shared/anchors/ceph
set -uo pipefail
{
DIR=${1:?usage: mds-memory-bench.sh DIR [kelp|ceph]}
SYS=${2:-kelp}
mkdir -p "$DIR"; DIR=$(cd "$DIR" && pwd)
HERE=$(cd "$(dirname "$0")" && pwd)
STEPS=${STEPS:-100000 250000 500000 1000000}
PROCS=${PROCS:-32}
CACHE=${CACHE:-1100000}
MAX_SECS=${MAX_SECS:-1500}
TERM_SECS=${TERM_SECS:-120}
CD=$DIR/cluster; OUT=$DIR/out; MNT=$DIR/mnt
rm -rf "$OUT"; mkdir -p "$OUT" "$MNT"
SUM=$OUT/summary.txt; : > "$SUM"
note() { echo "# $*" | tee -a "$SUM"; }
emit() { echo "$1 $2 $3" | tee -a "$SUM"; }
MDS=
case $SYS in
  kelp)
    KELP=${KELP:-$HERE/../target/release/kelp}
    [[ -x $KELP ]] || { echo "no kelp binary at $KELP (cargo build --release -p kelp)"; exit 1; }
    CLI() { "$KELP" -c "$CD/kelp.conf" "$@"; }
    up() { "$KELP" up --dir "$CD" --detach --osds 3 --osd-size 8GiB --no-rgw --timeout-secs 600 > "$OUT/up.log" 2>&1; }
    start_mds() {
      "$KELP" daemon stop mds.b --dir "$CD" >> "$OUT/up.log" 2>&1
      "$KELP" daemon stop mds.a --dir "$CD" >> "$OUT/up.log" 2>&1
      "$KELP" -c "$CD/kelp.conf" mds run --id a --cache-inodes "$CACHE" --data "$CD/mds.a" > "$OUT/mds.log" 2>&1 &
      echo $! > "$OUT/mds.pid"
      local i
      for i in $(seq 120); do CLI mds stat 2>/dev/null | grep -q '0=a=up:active' && return 0; sleep 1; done
      return 1
    }
    mdspid() { cat "$OUT/mds.pid"; }
    mount_fs() { CLI fs mount "$MNT" > "$OUT/mount.log" 2>&1 & }
    umount_fs() { "$KELP" fs umount "$MNT" >/dev/null 2>&1; }
    teardown() {
      if [[ -n $MDS ]]; then
        # SIGTERM makes the MDS write a final checkpoint; past TERM_SECS it is killed (noted)
        local i t0; t0=$(date +%s); kill "$MDS" 2>/dev/null
        for i in $(seq "$TERM_SECS"); do kill -0 "$MDS" 2>/dev/null || break; sleep 1; done
        if kill -0 "$MDS" 2>/dev/null; then
          note "the MDS had not exited $TERM_SECS s after SIGTERM: killed (see $OUT/mds.log)"; kill -9 "$MDS"
        else
          note "the MDS exited $(( $(date +%s) - t0 )) s after SIGTERM"
        fi
        wait "$MDS" 2>/dev/null
      fi
      "$KELP" down --dir "$CD" > "$OUT/down.log" 2>&1; rm -rf "$CD"
    }
    version() { "$KELP" --version; }
    stats() { python3 -c 'import os,sys; print(os.getxattr(sys.argv[1], "kelp.mds.stats").decode())' "$MNT"; }
    cached() { stats | python3 -c 'import json,sys; print(json.load(sys.stdin)["cached_inodes"])'; }
    unwritten() { stats | python3 -c 'import json,sys; print(json.load(sys.stdin)["unwritten_updates"])'; } ;;
  ceph)
    ANCHOR=${CEPH_ANCHOR:-$HERE/../../shared/anchors/ceph}
    [[ -x $ANCHOR/up.sh ]] || { echo "no Ceph anchor at $ANCHOR (set CEPH_ANCHOR)"; exit 1; }
    CLI() { ceph -c "$CD/ceph.conf" "$@"; }
    up() { ENABLE_RGW=0 "$ANCHOR/up.sh" "$CD" > "$OUT/up.log" 2>&1; }
    start_mds() {
      local i
      for i in $(seq 120); do CLI mds stat 2>/dev/null | grep -q '0=a=up:active' && return 0; sleep 1; done
      return 1
    }
    mdspid() { cat "$CD/run/mds.a.pid"; }
    mount_fs() { ceph-fuse -c "$CD/ceph.conf" "$MNT" > "$OUT/mount.log" 2>&1; }
    umount_fs() { umount -l "$MNT" >/dev/null 2>&1; }
    teardown() { "$ANCHOR/down.sh" "$CD" --purge > "$OUT/down.log" 2>&1; }
    version() { ceph --version; }
    perf() { ceph --admin-daemon "$(ls "$CD"/run/mds.a*.asok | head -1)" perf dump 2>/dev/null; }
    stats() { perf | python3 -c 'import json,sys; j=json.load(sys.stdin); print(json.dumps({"mds.inodes": j["mds"]["inodes"], "mds_mem.ino": j["mds_mem"]["ino"], "mds_mem.dn": j["mds_mem"]["dn"], "mds_mem.cap": j["mds_mem"]["cap"]}))'; }
    cached() { perf | python3 -c 'import json,sys; print(json.load(sys.stdin)["mds"]["inodes"])'; }
    unwritten() { :; } ;;   # no such figure: nothing emitted
  *) echo "usage: mds-memory-bench.sh DIR [kelp|ceph]" >&2; exit 2 ;;
esac
down() { umount_fs; sleep 1; teardown; }
rss_mib() { awk '/^VmRSS/ {printf "%.1f", $2 / 1024}' "/proc/$MDS/status"; }

note "mds memory $SYS $(version | head -1) $(date -u +%FT%TZ) commit=$(git -C "$HERE/.." rev-parse --short HEAD 2>/dev/null) host=$(nproc)cpu procs=$PROCS cache_inodes=$CACHE load=$(cut -d' ' -f1-3 /proc/loadavg)"
up || { note "bringing the cluster up failed, see $OUT/up.log"; tail -n 20 "$OUT/up.log"; down; exit 1; }
trap down EXIT
start_mds || { note "the MDS did not become active"; exit 1; }
MDS=$(mdspid)
[[ -n $MDS ]] || { note "no MDS pid"; exit 1; }
mount_fs
for i in $(seq 60); do mountpoint -q "$MNT" && break; sleep 1; done
mountpoint -q "$MNT" || { note "mount failed: $(tail -n 5 "$OUT/mount.log")"; exit 1; }
sleep 3
R0=$(rss_mib); C0=$(cached)
emit rss_at_0 "$R0" MiB
emit cached_at_0 "$C0" inodes
U=$(unwritten); [[ -z $U ]] || emit unwritten_at_0 "$U" updates
note "stats at 0: $(stats)"

HAVE=0; T_START=$(date +%s)
for N in $STEPS; do
  if (( $(date +%s) - T_START > MAX_SECS )); then note "step $N skipped: past MAX_SECS=$MAX_SECS s of creating"; continue; fi
  T=$(date +%s.%N); PIDS=()
  for p in $(seq 0 $((PROCS - 1))); do
    python3 - "$MNT/c$p" "$p" "$PROCS" "$HAVE" "$N" <<'EOF' &
import os, stat, sys
root, p, procs, lo, hi = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5])
# file number i (lo <= i < hi) belongs to creator i % procs, in directory i // 10000 of its own
for i in range(lo + (p - lo % procs) % procs, hi, procs):
    d = os.path.join(root, f"d{i // (10000 * procs):04d}")
    if not os.path.isdir(d):
        os.makedirs(d, exist_ok=True)
    os.mknod(os.path.join(d, f"f{i:08d}"), 0o644 | stat.S_IFREG)
EOF
    PIDS+=($!)
  done
  wait "${PIDS[@]}"
  rate=$(python3 -c "import sys,time; print(f'{(int(sys.argv[2]) - int(sys.argv[1])) / (time.time() - float(sys.argv[3])):.0f}')" "$HAVE" "$N" "$T")
  HAVE=$N
  sleep 3   # one checkpoint (2 s) and a second
  R=$(rss_mib); C=$(cached)
  emit "rss_at_$N" "$R" MiB
  emit "cached_at_$N" "$C" inodes
  U=$(unwritten); [[ -z $U ]] || emit "unwritten_at_$N" "$U" updates
  emit "create_rate_$N" "$rate" files/s
  python3 -c "import sys; r0,r,c0,c=map(float,sys.argv[1:]); print(f'bytes_per_inode_at_$N {(r-r0)*1048576/max(c-c0,1):.0f} B')" "$R0" "$R" "$C0" "$C" | tee -a "$SUM"
  note "after $N: $(date -u +%T) load=$(cut -d' ' -f1-3 /proc/loadavg)"
done
note "stats at end: $(stats)"
emit rss_peak "$(awk '/^VmHWM/ {printf "%.1f", $2 / 1024}' "/proc/$MDS/status")" MiB
}
