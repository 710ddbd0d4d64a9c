#!/usr/bin/env bash
# Recovery benchmark for Kelp, the counterpart of ../shared/anchors/ceph/recovery.sh (Ceph 16.2).
# For each MODE (default: "default lowimpact") on a FRESH cluster in DIR/MODE:
#   `kelp up --osds NUM_OSDS --pg-num PG_NUM --no-rgw --detach`: pool `data`, replicated size 3 /
#   min_size 2 (set explicitly), PG_NUM PGs, the default CRUSH rule (recorded: on one host its
#   failure domain is the OSD);
#   fill it with FILL_OBJS 4 MiB objects (`kelp rados bench write --max-objects --no-cleanup`);
#   wait until every PG is active+clean;
#   MODE=lowimpact: `kelp config set osd` for each KEY=VALUE of LOWIMPACT (MODE=default: defaults);
#   client load = `kelp rados bench overwrite -b LOAD_BS -t LOAD_T`: LOAD_BS-byte writes at random
#   aligned offsets inside the filled objects (the object count stays FILL_OBJS, like fio
#   randwrite on an RBD image in recovery.sh), per-second progress as JSON lines;
#   PRE s into the load: kill -9 osd.KILL_OSD (its pid from DIR/MODE/run/osd.N.pid) and
#   `kelp osd out KILL_OSD`; a 1 Hz sampler (`kelp status --format json`, /proc CPU) records PG
#   states, degraded/misplaced objects, recovery and client rates until every PG is active+clean
#   again. The load runs until POST s after clean, but at most LOAD_AFTER s after the failure; the
#   recovery is then timed to the end without load (at most MAX_WAIT s). Then `kelp down` and the
#   cluster directory is deleted (KEEP=1 keeps it).
# Prints `name value unit` lines (the figure names of recovery.sh where they apply); saves them to
# DIR/out-MODE/summary.txt. Raw data (fill.json, load.jsonl, monitor.jsonl, pgs/osd df before and
# after, status_after.txt) in DIR/out-MODE.
# Usage: scripts/recovery-bench.sh DIR
# Env: MODES="default lowimpact" NUM_OSDS=4 PG_NUM=128 FILL_OBJS=768 LOAD_BS=4096 LOAD_T=16 PRE=20
#      POST=10 LOAD_AFTER=120 MAX_WAIT=900 KILL_OSD=NUM_OSDS-1 OSD_SIZE=5GiB KEEP=0
#      LOWIMPACT="osd_max_backfills=1 osd_recovery_max_active=1 osd_recovery_op_priority=3"
#      KELP=target/release/kelp
set -uo pipefail
{  # whole script in one block: bash reads it fully before running it
DIR=${1:?usage: recovery-bench.sh DIR}
mkdir -p "$DIR"; DIR=$(cd "$DIR" && pwd)
HERE=$(cd "$(dirname "$0")" && pwd)
KELP=${KELP:-$HERE/../target/release/kelp}
KELP=$(cd "$(dirname "$KELP")" && pwd)/$(basename "$KELP")
MODES=${MODES:-"default lowimpact"}
NUM_OSDS=${NUM_OSDS:-4}
PG_NUM=${PG_NUM:-128}
FILL_OBJS=${FILL_OBJS:-768}
LOAD_BS=${LOAD_BS:-4096}
LOAD_T=${LOAD_T:-16}
PRE=${PRE:-20}
POST=${POST:-10}
LOAD_AFTER=${LOAD_AFTER:-120}
MAX_WAIT=${MAX_WAIT:-900}
KILL_OSD=${KILL_OSD:-$((NUM_OSDS - 1))}
OSD_SIZE=${OSD_SIZE:-5GiB}
KEEP=${KEEP:-0}
LOWIMPACT=${LOWIMPACT:-"osd_max_backfills=1 osd_recovery_max_active=1 osd_recovery_op_priority=3"}
[[ -x $KELP ]] || { echo "no kelp binary at $KELP (cargo build --release -p kelp)"; exit 1; }
# the OSD files are reserved (fallocated) at creation: refuse to start rather than fill a shared
# disk; the data must also fit: FILL_OBJS x 4 MiB x 3 copies on NUM_OSDS-1 survivors, < 80 %
python3 - "$DIR" "$OSD_SIZE" "$NUM_OSDS" "$FILL_OBJS" <<'EOF' || exit 1
import os, re, sys
d, size, n, fill = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
m = re.fullmatch(r'(\d+(?:\.\d+)?)\s*([KMGT]i?B?)?', size.strip(), re.I)
if not m:
    sys.exit(f"OSD_SIZE={size}: use e.g. 5GiB")
mult = {'K': 2**10, 'M': 2**20, 'G': 2**30, 'T': 2**40}.get((m.group(2) or 'B')[0].upper(), 1)
osd = float(m.group(1)) * mult
st = os.statvfs(d); free = st.f_bavail * st.f_frsize
need = n * osd + 2 * 2**30
if free < need:
    sys.exit(f"not enough free disk in {d}: {free/2**30:.1f} GiB, need {need/2**30:.1f} GiB "
             f"({n} x OSD_SIZE {size} + 2 GiB); lower OSD_SIZE/FILL_OBJS")
per_osd = fill * 4 * 2**20 * 3 / max(1, n - 1)
if per_osd > 0.8 * osd:
    sys.exit(f"FILL_OBJS={fill} puts {per_osd/2**30:.2f} GiB on each survivor, over 80 % of OSD_SIZE {size}")
EOF

write_monitor() {  # the 1 Hz sampler: python3 monitor.py KELP CONF OUT RUNDIR STOP KILLED CLEAN NIN
cat > "$1" <<'EOF'
import json, os, subprocess, sys, time
kelp, conf, out, rundir, stopf, killf, cleanf, nin = sys.argv[1:9]
nin = int(nin)
def host_busy():
    with open('/proc/stat') as f:
        v = list(map(int, f.readline().split()[1:]))
    return v[0] + v[1] + v[2] + v[5] + v[6] + v[7]          # user nice system irq softirq steal
def daemon_cpu():
    d = {}
    for fn in os.listdir(rundir):
        if not fn.endswith('.pid'):
            continue
        try:
            pid = int(open(os.path.join(rundir, fn)).read().strip())
            s = open('/proc/%d/stat' % pid).read().rsplit(')', 1)[1].split()
            d[fn[:-4]] = int(s[11]) + int(s[12])               # utime + stime (ticks)
        except Exception:
            pass
    return d
dirty_after_kill = False
fo = open(out, 'a')
while not os.path.exists(stopf):
    t0 = time.time()
    rec = {'t': t0, 'host_busy': host_busy(), 'dcpu': daemon_cpu()}
    try:
        p = subprocess.run([kelp, 'status', '--format', 'json', '-c', conf],
                           capture_output=True, text=True, timeout=5)
        s = json.loads(p.stdout); pm = s['pgmap']; om = s['osdmap']
        rec['num_pgs'] = pm['num_pgs']
        rec['states'] = {x['state_name']: x['count'] for x in pm['pgs_by_state']}
        for k in ('degraded_objects', 'misplaced_objects', 'recovering_bytes_per_sec',
                  'recovering_objects_per_sec', 'write_bytes_sec', 'write_op_per_sec',
                  'num_objects', 'bytes_used'):
            rec[k] = pm.get(k, 0)
        rec['recovery_progress'] = pm.get('recovery_progress')
        rec['up'] = om.get('num_up_osds'); rec['in'] = om.get('num_in_osds')
        rec['status_secs'] = round(time.time() - t0, 3)
    except Exception as e:
        rec['err_status'] = repr(e)
    killed = os.path.exists(killf)
    if killed and 'states' in rec:
        clean = rec['states'].get('active+clean', -1) == rec['num_pgs']
        if not clean:
            dirty_after_kill = True
        elif dirty_after_kill and rec.get('in') == nin and not os.path.exists(cleanf):
            open(cleanf, 'w').write('%.3f\n' % t0)
    fo.write(json.dumps(rec) + '\n'); fo.flush()
    time.sleep(max(0.0, 1.0 - (time.time() - t0)))
EOF
}

run_mode() {
  local mode=$1
  local CD=$DIR/$mode OUT=$DIR/out-$mode
  local CONF=$CD/kelp.conf
  rm -rf "$OUT" "$CD"; mkdir -p "$OUT"
  local SUM=$OUT/summary.txt; : > "$SUM"
  K() { "$KELP" "$@"; }
  export KELP_CONF=$CONF
  emit() { echo "$1 $2 $3" | tee -a "$SUM"; }
  local T0; T0=$(date +%s)
  echo "# recovery $mode $(date -u +%FT%TZ) host=$(nproc)cpu osds=$NUM_OSDS pg_num=$PG_NUM fill=${FILL_OBJS}x4MiB load=overwrite-b${LOAD_BS}-t${LOAD_T} kill=osd.$KILL_OSD kelp=$(git -C "$HERE" describe --always --dirty 2>/dev/null)" | tee -a "$SUM"

  K up --dir "$CD" --osds "$NUM_OSDS" --pg-num "$PG_NUM" --osd-size "$OSD_SIZE" --no-rgw --detach \
    > "$OUT/up.log" 2>&1 || { echo "# kelp up failed, see $OUT/up.log" | tee -a "$SUM"; K down --dir "$CD" >/dev/null 2>&1; return 1; }
  emit up_wall "$(( $(date +%s) - T0 ))" s
  K pool set data size 3 >/dev/null 2>&1; K pool set data min_size 2 >/dev/null 2>&1
  K pool get data > "$OUT/pool.txt" 2>&1
  K crush rule dump --format json > "$OUT/crush_rules.json" 2>&1
  emit cfg_pool "$(tr '\n' ' ' < "$OUT/pool.txt" | tr -s ' ' | sed 's/ $//; s/ /_/g')" "-"
  emit cfg_crush_failure_domain "$(python3 -c '
import json, sys
rules = json.load(open(sys.argv[1]))
rules = rules if isinstance(rules, list) else rules.get("rules", [rules])
types = [s.get("type") for r in rules for s in r.get("steps", []) if isinstance(s, dict) and s.get("type")]
print(",".join(map(str, types)) or "?")' "$OUT/crush_rules.json" 2>/dev/null || echo '?')" "-"
  clean_now() {
    K status --format json 2>/dev/null | python3 -c '
import json, sys
pm = json.load(sys.stdin)["pgmap"]
c = sum(x["count"] for x in pm["pgs_by_state"] if x["state_name"] == "active+clean")
sys.exit(0 if pm["num_pgs"] > 0 and c == pm["num_pgs"] else 1)'
  }
  wait_clean() {
    for _ in $(seq "$1"); do clean_now && return 0; sleep 2; done
    echo "# not clean after $(( $1 * 2 )) s: $(K status 2>&1 | grep -A3 pgs: | tr -s ' ' | tr '\n' ' ')" | tee -a "$SUM"; return 1
  }
  wait_clean 150 || { K down --dir "$CD" >/dev/null 2>&1; return 1; }

  # ---- fill ----
  local tf; tf=$(date +%s.%N)
  K rados -p data bench 3600 write -b 4MiB -t 16 --max-objects "$FILL_OBJS" --no-cleanup --format json \
    > "$OUT/fill.json" 2> "$OUT/fill.err"
  emit fill_wall "$(python3 -c "import time; print(f'{time.time()-$tf:.1f}')")" s
  emit fill_MiBps "$(python3 -c 'import json,sys; j = json.loads(open(sys.argv[1]).read().splitlines()[-1]); print("%.1f" % j["bandwidth_mib_s"])' "$OUT/fill.json" 2>/dev/null)" MiB/s
  wait_clean 300 || { K down --dir "$CD" >/dev/null 2>&1; return 1; }

  # ---- recovery settings ----
  if [[ $mode == lowimpact ]]; then
    for kv in $LOWIMPACT; do K config set osd "${kv%%=*}" "${kv#*=}" >> "$OUT/config.log" 2>&1; done
    sleep 6      # OSDs re-read the central config every 5 s
  fi
  for o in osd_max_backfills osd_recovery_max_active osd_recovery_sleep osd_stats_interval \
           osd_heartbeat_interval osd_heartbeat_grace mon_osd_session_grace; do
    v=$(K config get osd "$o" 2>/dev/null | tail -1 | awk '{print $NF}')
    emit "cfg_$o" "${v:-default}" "-"
  done

  # ---- what the victim holds ----
  K pg ls --format json > "$OUT/pgs_before.json" 2>&1
  K osd df --format json > "$OUT/osd_df_before.json" 2>&1

  # ---- sampler + load + failure ----
  write_monitor "$OUT/monitor.py"
  rm -f "$OUT"/{stop,killed,clean,launched,load_stopped}
  python3 "$OUT/monitor.py" "$KELP" "$CONF" "$OUT/monitor.jsonl" "$CD/run" "$OUT/stop" "$OUT/killed" \
    "$OUT/clean" "$((NUM_OSDS - 1))" 2> "$OUT/monitor.err" &
  local MONPID=$!
  sleep 2
  date +%s.%N > "$OUT/launched"
  # run the binary itself in the background (not the K function: a subshell would get the INT)
  "$KELP" rados -p data bench "$MAX_WAIT" overwrite -b "$LOAD_BS" -t "$LOAD_T" --progress-json --format json \
    > "$OUT/load.jsonl" 2> "$OUT/load.err" &
  local BPID=$!
  # wait until the bench has printed its line for second PRE
  local s=0
  for _ in $(seq $(( (PRE + 60) * 10 ))); do
    s=$(python3 -c '
import json, sys
s = 0
for l in open(sys.argv[1]):
    try: s = max(s, json.loads(l).get("sec", 0))
    except Exception: pass
print(s)' "$OUT/load.jsonl" 2>/dev/null || echo 0)
    (( s >= PRE )) && break
    kill -0 $BPID 2>/dev/null || break
    sleep 0.1
  done
  local VPID; VPID=$(cat "$CD/run/osd.$KILL_OSD.pid")
  local TK; TK=$(date +%s.%N)
  kill -9 "$VPID"
  echo "$TK" > "$OUT/killed"
  K osd out "$KILL_OSD" > "$OUT/out.txt" 2>&1
  echo "# killed osd.$KILL_OSD (pid $VPID) at bench second $s, epoch $TK; marked out" | tee -a "$SUM"
  stop_load() {
    date +%s.%N > "$OUT/load_stopped"
    kill -INT $BPID 2>/dev/null     # the bench stops on INT and prints its summary
    for _ in $(seq 100); do kill -0 $BPID 2>/dev/null || break; sleep 0.1; done
    kill -0 $BPID 2>/dev/null && kill -KILL $BPID 2>/dev/null
    wait $BPID 2>/dev/null
    [[ -s $OUT/load.jsonl ]] && tail -1 "$OUT/load.jsonl" | grep -q '"mode"' \
      || echo "# the load ended without its summary (killed)" | tee -a "$SUM"
  }
  local loadon=1
  for _ in $(seq "$MAX_WAIT"); do
    [[ -e $OUT/clean ]] && break
    if (( loadon )) && (( $(date +%s) - ${TK%.*} >= LOAD_AFTER )); then
      echo "# not clean ${LOAD_AFTER} s after the failure: stopping the client load, timing the rest" | tee -a "$SUM"
      stop_load; loadon=0
    fi
    sleep 1
  done
  [[ -e $OUT/clean ]] || echo "# NOT clean after ${MAX_WAIT} s" | tee -a "$SUM"
  if (( loadon )); then sleep "$POST"; stop_load; fi
  touch "$OUT/stop"; wait $MONPID 2>/dev/null
  K pg ls --format json > "$OUT/pgs_after.json" 2>&1
  K osd df --format json > "$OUT/osd_df_after.json" 2>&1
  K status > "$OUT/status_after.txt" 2>&1
  for f in "$CD"/run/*.pid; do
    n=$(basename "$f" .pid); p=$(cat "$f")
    [[ -r /proc/$p/status ]] || continue
    emit "rss_$n" "$(awk '/^VmRSS/{printf "%.0f", $2/1024}' /proc/"$p"/status)" MiB
  done
  cp "$CD"/logs/osd.*.log "$OUT"/ 2>/dev/null

  # ---- analysis ----
  python3 - "$OUT" "$LOAD_BS" "$PRE" "$KILL_OSD" "$NUM_OSDS" <<'EOF' | tee -a "$SUM"
import json, math, os, sys
out, bs, pre, victim, nosd = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5])
tk = float(open(out + '/killed').read())
tclean = float(open(out + '/clean').read()) if os.path.exists(out + '/clean') else None
# per-second client ops: ops[i] = ops completed in load second (i-1, i]
ops, summary = {}, None
for line in open(out + '/load.jsonl'):
    try:
        j = json.loads(line)
    except Exception:
        continue
    if 'sec' in j:
        ops[j['sec']] = j['ops_sec']
    elif 'mode' in j:
        summary = j
if not ops:
    print("# no client progress recorded"); sys.exit(0)
last = max(ops)
t0 = tk - pre        # the kill follows the progress line of second PRE (polled every 0.1 s)
K = tk - t0
print(f"load_second_of_kill {K:.1f} s")
def rate(a, b):      # mean ops/s over whole load seconds in (a, b]
    a = max(0, int(math.ceil(a))); b = min(last, int(math.floor(b)))
    return (sum(ops.get(i, 0) for i in range(a + 1, b + 1)) / (b - a), a, b) if b > a else (float('nan'), a, b)
mib = bs / 2**20
def both(name, a, b):
    r, a, b = rate(a, b)
    print(f"{name}_ops {r:.1f} ops/s")
    print(f"{name}_MiBps {r*mib:.2f} MiB/s")
    print(f"{name}_window {a}-{b} s")
    return r
before = both('client_before', 0, K)
both('client_before_last10', K - 10, K)
ts = float(open(out + '/load_stopped').read())
stopped_early = tclean is None or ts < tclean
print(f"load_stopped_before_clean {int(stopped_early)} -")
print(f"load_ran_after_failure {ts - tk:.1f} s")
sc = K + ((tclean if tclean and not stopped_early else ts) - tk)
during = both('client_during_recovery', K, sc)
if before == before and during == during and before > 0:
    print(f"client_during_recovery_pct {100.0 * during / before:.0f} %")
first10 = both('client_first10s_after_kill', K, K + 10)
if before == before and first10 == first10 and before > 0:
    print(f"client_first10s_after_kill_pct {100.0 * first10 / before:.0f} %")
if not stopped_early:
    both('client_after_clean', sc, last)
per = [ops.get(i, 0) for i in range(int(math.ceil(K)) + 1, min(int(sc), last) + 1)]
if per:
    print(f"client_during_recovery_min_1s {min(per)} ops")
    print(f"client_during_recovery_zero_seconds {sum(1 for x in per if x == 0)} s")
if summary:
    print(f"client_errors {summary.get('errors', 0)} ops")
    print(f"client_latency_p99 {summary['latency_ms']['p99']:.1f} ms")
    print(f"client_latency_max {summary['latency_ms']['max']:.1f} ms")
if tclean:
    print(f"time_to_active_clean {tclean - tk:.1f} s")
    if stopped_early:
        print(f"time_to_active_clean_after_load_stop {tclean - ts:.1f} s")
recs = [json.loads(l) for l in open(out + '/monitor.jsonl')]
post = [r for r in recs if r['t'] >= tk and 'states' in r]
def first(pred):
    for r in post:
        if pred(r):
            return r['t'] - tk
    return None
tdown = first(lambda r: r.get('up') == nosd - 1)
tdirty = first(lambda r: r['states'].get('active+clean', -1) != r['num_pgs'])
print(f"time_osd_marked_down {tdown:.1f} s" if tdown is not None else "# osd down not seen")
print(f"time_first_unclean_report {tdirty:.1f} s" if tdirty is not None else "# no unclean report seen")
if tdirty is not None:
    after = [r for r in post if r['t'] - tk >= tdirty and (tclean is None or r['t'] <= tclean)]
    def inactive(r):
        return sum(n for s, n in r['states'].items()
                   if 'active' not in s.split('+') or 'stale' in s.split('+'))
    inact = [r for r in after if inactive(r) > 0]
    ta = (inact[-1]['t'] - tk + 1) if inact else tdirty
    print(f"time_all_pgs_active {ta:.1f} s")
    print(f"seconds_with_inactive_pgs {len(inact)} s")
    print(f"inactive_pgs_max {max((inactive(r) for r in after), default=0)} pgs")
    deg = [r for r in after if r.get('degraded_objects', 0) > 0]
    if deg and tclean:
        print(f"time_no_degraded_objects {deg[-1]['t'] - tk + 1:.1f} s")
    print(f"degraded_objects_max {max((r['degraded_objects'] for r in deg), default=0)} objects")
    mis = [r.get('misplaced_objects', 0) for r in after]
    print(f"misplaced_objects_max {max(mis) if mis else 0} objects")
    rb = [r.get('recovering_bytes_per_sec', 0) for r in after]
    if rb:
        print(f"recovery_rate_peak {max(rb)/2**20:.1f} MiB/s")
    ro = [r.get('recovering_objects_per_sec', 0) for r in after]
    if ro:
        print(f"recovery_objects_rate_peak {max(ro)} objects/s")
    # the leader's recovery rate integrated over the samples (piecewise constant between them)
    w = [r for r in post if tclean is None or r['t'] <= tclean + 3]
    rbytes = sum(a.get('recovering_bytes_per_sec', 0) * (b['t'] - a['t']) for a, b in zip(w, w[1:]))
    robj = sum(a.get('recovering_objects_per_sec', 0) * (b['t'] - a['t']) for a, b in zip(w, w[1:]))
    print(f"recovered_bytes_rate_integral {rbytes/2**30:.3f} GiB")
    print(f"recovered_objects_rate_integral {robj:.0f} objects")
    etas = [r['recovery_progress'].get('eta_secs') for r in after if r.get('recovery_progress')]
    print(f"samples_with_recovery_progress {len(etas)} -")
# CPU in the two windows (host busy and kelp daemons, cores)
tck = os.sysconf('SC_CLK_TCK')
def cpu(ta, tb):
    w = [r for r in recs if ta <= r['t'] <= tb]
    if len(w) < 2: return None
    a, b = w[0], w[-1]; dt = b['t'] - a['t']
    hb = (b['host_busy'] - a['host_busy']) / tck / dt
    dc = (sum(b['dcpu'].values()) - sum(v for k, v in a['dcpu'].items() if k in b['dcpu'])) / tck / dt
    return hb, dc
c = cpu(tk - pre, tk)
if c: print(f"cpu_before_host {c[0]:.2f} cores"); print(f"cpu_before_daemons {c[1]:.2f} cores")
if tclean:
    c = cpu(tk, tclean)
    if c: print(f"cpu_recovery_host {c[0]:.2f} cores"); print(f"cpu_recovery_daemons {c[1]:.2f} cores")
# what the victim held (PGs whose acting set had it, as their primaries reported)
def pgs(f):
    try:
        d = json.load(open(f))
    except Exception:
        return []
    if isinstance(d, dict):
        d = d.get('pg_stats') or d.get('pgs') or []
    return d
def field(p, *names):
    for n in names:
        if n in p: return p[n]
        if 'stat' in p and n in p['stat']: return p['stat'][n]
    return 0
v = [p for p in pgs(out + '/pgs_before.json') if victim in field(p, 'acting')]
print(f"victim_pgs {len(v)} pgs")
print(f"victim_data {sum(field(p, 'num_bytes', 'bytes') for p in v)/2**30:.3f} GiB")
print(f"victim_objects {sum(field(p, 'num_objects', 'objects') for p in v)} objects")
def osd_used(f):
    try:
        d = json.load(open(f))
    except Exception:
        return {}
    nodes = d.get('nodes', d) if isinstance(d, dict) else d
    return {n['id']: n.get('kb_used', 0) * 1024 for n in nodes if isinstance(n, dict) and 'id' in n}
db, da = osd_used(out + '/osd_df_before.json'), osd_used(out + '/osd_df_after.json')
grow = sum(da[k] - db[k] for k in da if k != victim and k in db)
print(f"survivors_used_growth {grow/2**30:.3f} GiB")
wr = sum(ops.values()) * bs
print(f"client_data_written_during_test {wr/2**30:.3f} GiB")
if tclean and rbytes:
    print(f"recovery_avg_rate {rbytes/2**20/(tclean-tk):.1f} MiB/s")
EOF
  emit mode_wall "$(( $(date +%s) - T0 ))" s
  K down --dir "$CD" > "$OUT/down.log" 2>&1
  (( KEEP )) || rm -rf "$CD"
}

for m in $MODES; do run_mode "$m"; done
exit 0
}
