#!/usr/bin/env bash
# MDS failover as a client sees it, for Kelp or for Ceph 16.2 (the anchor's up.sh/down.sh), one
# fresh cluster per invocation:
#   Kelp: `kelp up` (3 OSDs, mds.a active + mds.b standby), mounted with `kelp fs mount`.
#   Ceph: up.sh (mon, mgr, 3 OSDs, no rgw, mds.a + CephFS), then a second MDS `b` started by hand
#         the way up.sh starts `a`; standby-replay stays off (the file system's
#         allow_standby_replay is false, Ceph's default), so b is a plain standby, like Kelp's.
#         Mounted with ceph-fuse.
#   A client loop on the mount creates a small file and stats it, one op per ~10 ms, and logs
#   the wall-clock time of every completed op. Each rep: the active MDS (its pid from
#   DIR/cluster/run/mds.NAME.pid, its name from `mds stat`) is killed with kill -9; a poller runs
#   `mds stat` every ~0.2 s until the map shows the other MDS up:active. The killed daemon is
#   then restarted and must register as the standby before the next rep.
# Figures per rep: outage (kill to the end of the longest pause between completed client ops
# around it: the first op completed after the failover; an op answered just before the kill may
# complete a few ms after it, and is not the resumption), longest_pause, map_active (kill
# to the first `mds stat` showing the standby up:active; the CLI's own latency, ~0.1-0.5 s, is
# the resolution), and at the end missing_files (files whose create completed before a kill but
# are absent from a final listing; must be 0). Then the median of each over the reps.
# Prints `name value unit` lines; saves them to DIR/out/summary.txt; the client's op log is
# DIR/out/ops.log (`epoch_seconds index`), the polls DIR/out/poll.N.log, per kill `rep kill_time
# map_time` in DIR/out/kills.log.
# Usage: scripts/mds-failover-bench.sh DIR kelp|ceph
# Env: REPS=3  GRACE= (Ceph only: `ceph config set global mds_beacon_grace GRACE` before the
#      first kill, e.g. 5 for Kelp's default; empty keeps Ceph's default, 15 s; Kelp's is 5 s;
#      with GRACE also mds_beacon_interval=BEACON_INTERVAL (1, Kelp's; Ceph's default 4) and
#      mon_tick_interval=MON_TICK (1; default 5), without which Ceph's monitor never fails an
#      MDS at a grace of 5 s)  SETTLE=8 (seconds of ops before each kill)
#      MAX_WAIT=180 (longest wait for a failover)  KELP=target/release/kelp
#      CEPH_ANCHOR=../shared/anchors/ceph
set -uo pipefail
{  # whole script in one block: bash reads it fully before running it
DIR=${1:?usage: mds-failover-bench.sh DIR kelp|ceph}
SYS=${2:?usage: mds-failover-bench.sh DIR kelp|ceph}
mkdir -p "$DIR"; DIR=$(cd "$DIR" && pwd)
HERE=$(cd "$(dirname "$0")" && pwd)
REPS=${REPS:-3}
GRACE=${GRACE:-}
BEACON_INTERVAL=${BEACON_INTERVAL:-1}
MON_TICK=${MON_TICK:-1}
SETTLE=${SETTLE:-8}
MAX_WAIT=${MAX_WAIT:-180}
CD=$DIR/cluster; OUT=$DIR/out; MNT=$DIR/mnt
rm -rf "$OUT"; mkdir -p "$OUT" "$MNT"
SUM=$OUT/summary.txt; : > "$SUM"
note() { echo "# $*" | tee -a "$SUM"; }
emit() { echo "$1 $2 $3" | tee -a "$SUM"; }
now() { date +%s.%N; }

case $SYS in
  kelp)
    KELP=${KELP:-$HERE/../target/release/kelp}
    [[ -x $KELP ]] || { echo "no kelp binary at $KELP (cargo build --release -p kelp)"; exit 1; }
    [[ -z $GRACE ]] || { echo "GRACE is for Ceph only (Kelp's mds_beacon_grace is 5 s)" >&2; exit 2; }
    CLI() { "$KELP" -c "$CD/kelp.conf" "$@"; }
    up() {
      "$KELP" up --dir "$CD" --detach --osds 3 --osd-size 4GiB --no-rgw --timeout-secs 600 \
        > "$OUT/up.log" 2>&1 || return 1
    }
    down() { "$KELP" fs umount "$MNT" >/dev/null 2>&1; sleep 1; "$KELP" down --dir "$CD" > "$OUT/down.log" 2>&1; rm -rf "$CD"; }
    mount_fs() { CLI fs mount "$MNT" > "$OUT/mount.log" 2>&1 & }
    mdsstat() { CLI mds stat 2>/dev/null; }
    restart_mds() { "$KELP" daemon start "mds.$1" --dir "$CD" >> "$OUT/restart.log" 2>&1; }
    version() { "$KELP" --version; } ;;
  ceph)
    ANCHOR=${CEPH_ANCHOR:-$HERE/../../shared/anchors/ceph}
    [[ -x $ANCHOR/up.sh ]] || { echo "no Ceph anchor at $ANCHOR (set CEPH_ANCHOR)"; exit 1; }
    CLI() { ceph -c "$CD/ceph.conf" "$@"; }
    up() {
      ENABLE_RGW=0 "$ANCHOR/up.sh" "$CD" > "$OUT/up.log" 2>&1 || return 1
      if [[ -n $GRACE ]]; then
        # Ceph's monitor resets every MDS's beacon timer when its own ticks (mon_tick_interval,
        # 5 s) are further apart than mds_beacon_grace - mds_beacon_interval (4 s), taking
        # that for a slow monitor: with grace 5 and the other two at their defaults no MDS is
        # ever failed. So Kelp's whole set is used: beacons every second, and the monitor
        # ticks every second.
        CLI config set global mds_beacon_grace "$GRACE" &&
          CLI config set global mds_beacon_interval "$BEACON_INTERVAL" &&
          CLI config set global mon_tick_interval "$MON_TICK" || return 1
      fi
      CLI fs set cephfs allow_standby_replay false >> "$OUT/up.log" 2>&1
      mkdir -p "$CD/mds.b"
      CLI auth get-or-create mds.b mon 'allow profile mds' osd 'allow rwx' mds 'allow *' \
        mgr 'allow profile mds' -o "$CD/mds.b/keyring" >> "$OUT/up.log" 2>&1 || return 1
      ceph-mds -c "$CD/ceph.conf" -i b >> "$OUT/up.log" 2>&1
    }
    down() { umount -l "$MNT" >/dev/null 2>&1; "$ANCHOR/down.sh" "$CD" --purge > "$OUT/down.log" 2>&1; }
    mount_fs() { ceph-fuse -c "$CD/ceph.conf" "$MNT" > "$OUT/mount.log" 2>&1; }
    mdsstat() { CLI mds stat 2>/dev/null; }
    restart_mds() { ceph-mds -c "$CD/ceph.conf" -i "$1" >> "$OUT/restart.log" 2>&1; }
    version() { ceph --version; } ;;
  *) echo "usage: mds-failover-bench.sh DIR kelp|ceph" >&2; exit 2 ;;
esac

# active: the name of rank 0's MDS when it is up:active (`{0=a=up:active}` in `mds stat`)
active() { mdsstat | sed -n 's/.*0=\([A-Za-z0-9_.-]*\)=up:active.*/\1/p' | head -1; }
# standbys: the number of standbys in `mds stat` (`1 up:standby`)
standbys() { mdsstat | sed -n 's/.* \([0-9][0-9]*\) up:standby.*/\1/p' | head -1; }
# wait_pair SECONDS: one MDS active and one standby
wait_pair() {
  local i
  for i in $(seq "$1"); do
    [[ -n $(active) && $(standbys) == 1 ]] && return 0
    sleep 1
  done
  return 1
}

note "mds failover $SYS $(version | head -1) $(date -u +%FT%TZ) commit=$(git -C "$HERE/.." rev-parse --short HEAD 2>/dev/null) host=$(nproc)cpu reps=$REPS grace=${GRACE:-default}${GRACE:+ mds_beacon_interval=$BEACON_INTERVAL mon_tick_interval=$MON_TICK} load=$(cut -d' ' -f1-3 /proc/loadavg)"
up || { note "bringing the cluster up failed, see $OUT/up.log"; tail -n 20 "$OUT/up.log"; down; exit 1; }
CLIENT=
cleanup() { [[ -n $CLIENT ]] && { kill "$CLIENT" 2>/dev/null; wait "$CLIENT" 2>/dev/null; }; down; }
trap cleanup EXIT
wait_pair 120 || { note "no active+standby MDS pair: $(mdsstat)"; exit 1; }
note "map before: $(mdsstat)"
mount_fs
for i in $(seq 60); do mountpoint -q "$MNT" && break; sleep 1; done
mountpoint -q "$MNT" || { note "mount failed: $(tail -n 5 "$OUT/mount.log")"; exit 1; }
mkdir -p "$MNT/failover" || { note "cannot write to the mount"; exit 1; }

# The client: create+stat one small file per ~10 ms; `epoch index` per completed op.
python3 - "$MNT/failover" "$OUT/ops.log" <<'EOF' &
import os, sys, time
d, log = sys.argv[1], sys.argv[2]
with open(log, "w", buffering=1) as f:
    i = 0
    while True:
        p = os.path.join(d, f"f{i:07d}")
        try:
            fd = os.open(p, os.O_CREAT | os.O_WRONLY | os.O_EXCL, 0o644)
            os.write(fd, b"x")
            os.close(fd)
            os.stat(p)
        except OSError as e:
            f.write(f"# {time.time():.3f} {i} error {e}\n")
            time.sleep(0.1)
            continue
        f.write(f"{time.time():.3f} {i}\n")
        i += 1
        time.sleep(0.01)
EOF
CLIENT=$!

declare -a OUTAGE MAPT
KILLS=()
for rep in $(seq "$REPS"); do
  sleep "$SETTLE"
  A=$(active)
  [[ -n $A ]] || { note "rep $rep: no active MDS: $(mdsstat)"; break; }
  PID=$(cat "$CD/run/mds.$A.pid" 2>/dev/null)
  [[ -n $PID ]] && kill -0 "$PID" 2>/dev/null || { note "rep $rep: no live pid for mds.$A"; break; }
  T0=$(now)
  kill -9 "$PID"
  KILLS+=("$T0")
  # poll the map until another MDS is active
  : > "$OUT/poll.$rep.log"; T1=
  while python3 -c "import sys; sys.exit(0 if float(sys.argv[2]) - float(sys.argv[1]) < float(sys.argv[3]) else 1)" "$T0" "$(now)" "$MAX_WAIT"; do
    s=$(mdsstat); t=$(now); echo "$t $s" >> "$OUT/poll.$rep.log"
    b=$(echo "$s" | sed -n 's/.*0=\([A-Za-z0-9_.-]*\)=up:active.*/\1/p' | head -1)
    if [[ -n $b && $b != "$A" ]]; then T1=$t; break; fi
    sleep 0.2
  done
  [[ -n $T1 ]] || { note "rep $rep: no standby active within $MAX_WAIT s"; break; }
  # the outage: the longest pause between completed client ops that reaches past the kill
  # (an op already answered when the kill lands may complete just after it); measured once the
  # client has completed ops for 2 s past the map's change
  OUT_T=
  for i in $(seq "$MAX_WAIT"); do
    OUT_T=$(python3 - "$OUT/ops.log" "$T0" "$T1" <<'EOF'
import sys
log, t0, t1 = sys.argv[1], float(sys.argv[2]), float(sys.argv[3])
ts = [float(l.split()[0]) for l in open(log) if l.strip() and not l.startswith("#")]
if not ts or ts[-1] < max(t0, t1) + 2:
    sys.exit(0)
prev = max([t for t in ts if t <= t0], default=t0)
after = [t for t in ts if t > t0]
best, end = 0.0, after[0]
for t in after:
    if t - prev > best and t <= max(t0, t1) + 2:
        best, end = t - prev, t
    prev = t
print(f"{end - t0:.2f} {best:.2f}")
EOF
)
    [[ -n $OUT_T ]] && break; sleep 1
  done
  [[ -n $OUT_T ]] || { note "rep $rep: client did not resume within $MAX_WAIT s"; break; }
  read -r OUTAGE[$rep] STALL <<< "$OUT_T"
  echo "$rep $T0 $T1" >> "$OUT/kills.log"
  MAPT[$rep]=$(python3 -c "import sys; print(f'{float(sys.argv[2]) - float(sys.argv[1]):.2f}')" "$T0" "$T1")
  emit "rep${rep}_outage" "${OUTAGE[$rep]}" s
  emit "rep${rep}_longest_pause" "$STALL" s
  emit "rep${rep}_map_active" "${MAPT[$rep]}" s
  note "rep $rep: killed mds.$A (pid $PID), now $(active) active"
  restart_mds "$A"
  wait_pair 120 || { note "rep $rep: mds.$A did not come back as the standby: $(mdsstat)"; break; }
done

sleep 2
kill "$CLIENT" 2>/dev/null; wait "$CLIENT" 2>/dev/null; CLIENT=
# every file whose create completed before the last kill must be listed
python3 - "$MNT/failover" "$OUT/ops.log" "${KILLS[-1]:-0}" <<'EOF' | tee -a "$SUM"
import os, sys
d, log, last = sys.argv[1], sys.argv[2], float(sys.argv[3])
done = [int(l.split()[1]) for l in open(log) if l.strip() and not l.startswith("#") and float(l.split()[0]) < last]
have = set(os.listdir(d))
missing = [i for i in done if f"f{i:07d}" not in have]
errors = sum(1 for l in open(log) if l.startswith("#"))
print(f"files_before_last_kill {len(done)} files")
print(f"missing_files {len(missing)} files")
print(f"client_errors {errors} ops")
EOF
python3 - "${OUTAGE[@]:-}" <<'EOF' | sed 's/^/median_outage /; s/$/ s/' | tee -a "$SUM"
import statistics, sys
v = [float(x) for x in sys.argv[1:] if x]
print(f"{statistics.median(v):.2f}" if v else "none")
EOF
python3 - "${MAPT[@]:-}" <<'EOF' | sed 's/^/median_map_active /; s/$/ s/' | tee -a "$SUM"
import statistics, sys
v = [float(x) for x in sys.argv[1:] if x]
print(f"{statistics.median(v):.2f}" if v else "none")
EOF
note "load after: $(cut -d' ' -f1-3 /proc/loadavg)"
}
