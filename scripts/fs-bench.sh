#!/usr/bin/env bash
# File-system benchmark against any mounted file system (a `kelp fs mount`, or ceph-fuse for the
# side-by-side figures): the fio jobs of the Ceph anchor's CephFS test (libaio, direct), then
# metadata rates (creates, stats, unlinks per second, on one mount and on two at once), then
# the wall time of untarring a tree of small files and of `ls -lR` and `du -s` over it.
# Prints `name value unit` lines (also to OUT/summary.txt).
#
# Usage: scripts/fs-bench.sh MOUNT [MOUNT2]
#   MOUNT2: a second mount of the same file system (the two-mount metadata rates); optional.
# Env: DUR=20 (seconds per fio job), FILES=5000 (files per metadata pass), TREE=50000 (files in
#      the untarred tree), OUT=/tmp/fs-bench.$$ (logs), SKIP="fio meta tree" (groups to skip).
set -uo pipefail
{
MNT=${1:?usage: fs-bench.sh MOUNT [MOUNT2]}
MNT2=${2:-}
DUR=${DUR:-20}
FILES=${FILES:-5000}
TREE=${TREE:-50000}
OUT=${OUT:-/tmp/fs-bench.$$}
SKIP=${SKIP:-}
mkdir -p "$OUT"
SUM=$OUT/summary.txt; : > "$SUM"
emit() { echo "$1 $2 $3" | tee -a "$SUM"; }
skip() { [[ " $SKIP " == *" $1 "* ]]; }
now() { date +%s.%N; }
since() { python3 -c "import sys; print(f'{float(sys.argv[2]) - float(sys.argv[1]):.2f}')" "$1" "$(now)"; }

WORK=$MNT/fs-bench.$$
mkdir -p "$WORK" || { echo "cannot write to $MNT" >&2; exit 1; }
trap 'rm -rf "$WORK"' EXIT

# ---------------- fio: the anchor's jobs ----------------
fio_job() {  # fio_job NAME RW BS IODEPTH FIELD(write|read)
  local name=$1 rw=$2 bs=$3 qd=$4 field=$5
  fio --name="$name" --filename="$WORK/fio.dat" --size=1G --ioengine=libaio --direct=1 \
    --runtime="$DUR" --time_based --ramp_time=2 --rw="$rw" --bs="$bs" --iodepth="$qd" \
    --output-format=json >"$OUT/$name.json" 2>"$OUT/$name.err" || { echo "# $name failed" | tee -a "$SUM"; return; }
  python3 - "$name" "$OUT/$name.json" "$field" <<'EOF' | tee -a "$SUM"
import json, sys
name, path, field = sys.argv[1:]
j = json.load(open(path))["jobs"][0][field]
print(f"{name}_iops {j['iops']:.0f} ops/s")
print(f"{name}_bw {j['bw_bytes'] / 1048576:.1f} MiB/s")
p = j.get("clat_ns", {}).get("percentile", {})
if "99.000000" in p:
    print(f"{name}_p99 {p['99.000000'] / 1e6:.2f} ms")
EOF
}
if ! skip fio; then
  fio --name=prep --filename="$WORK/fio.dat" --size=1G --rw=write --bs=4M --direct=1 >/dev/null 2>&1
  fio_job fs_4k_randwrite randwrite 4k 16 write
  fio_job fs_4m_write write 4M 4 write
  fio_job fs_4m_read read 4M 4 read
  rm -f "$WORK/fio.dat"
fi

# ---------------- metadata rates ----------------
# meta_pass DIR N: creates N empty files, stats each, unlinks each; prints three rates.
meta_pass() {
  python3 - "$1" "$2" <<'EOF'
import os, sys, time
d, n = sys.argv[1], int(sys.argv[2])
os.makedirs(d, exist_ok=True)
names = [os.path.join(d, f"f{i:07d}") for i in range(n)]
t = time.monotonic()
for p in names:
    os.close(os.open(p, os.O_CREAT | os.O_WRONLY | os.O_EXCL, 0o644))
c = n / (time.monotonic() - t)
t = time.monotonic()
for p in names:
    os.stat(p)
s = n / (time.monotonic() - t)
t = time.monotonic()
for p in names:
    os.unlink(p)
u = n / (time.monotonic() - t)
os.rmdir(d)
print(f"{c:.0f} {s:.0f} {u:.0f}")
EOF
}
if ! skip meta; then
  read -r c s u < <(meta_pass "$WORK/meta1" "$FILES")
  emit fs_creates_1mount "$c" ops/s; emit fs_stats_1mount "$s" ops/s; emit fs_unlinks_1mount "$u" ops/s
  if [[ -n $MNT2 ]]; then
    mkdir -p "$MNT2/fs-bench.$$.b"
    meta_pass "$WORK/meta2a" "$FILES" >"$OUT/meta2a" &
    meta_pass "$MNT2/fs-bench.$$.b/meta2b" "$FILES" >"$OUT/meta2b"
    wait
    rmdir "$MNT2/fs-bench.$$.b"
    read -r ca sa ua <"$OUT/meta2a"; read -r cb sb ub <"$OUT/meta2b"
    emit fs_creates_2mounts "$((ca + cb))" ops/s; emit fs_stats_2mounts "$((sa + sb))" ops/s
    emit fs_unlinks_2mounts "$((ua + ub))" ops/s
  fi
fi

# ---------------- a tree of small files: untar, ls -lR, du -s ----------------
if ! skip tree; then
  TAR=/tmp/fs-bench-tree-$TREE.tar
  if [[ ! -s $TAR ]]; then
    src=$(mktemp -d)
    python3 - "$src" "$TREE" <<'EOF'
import os, random, sys
root, n = sys.argv[1], int(sys.argv[2])
rng = random.Random(42)
per_dir = 100
for i in range(n):
    d = os.path.join(root, "tree", f"d{i // (per_dir * 50):03d}", f"e{(i // per_dir) % 50:03d}")
    if i % per_dir == 0:
        os.makedirs(d, exist_ok=True)
    with open(os.path.join(d, f"file{i:06d}.txt"), "wb") as f:
        f.write(rng.randbytes(rng.randint(0, 4096)))
EOF
    tar -C "$src" -cf "$TAR" tree && rm -rf "$src"
  fi
  t0=$(now); tar -C "$WORK" -xf "$TAR"; emit fs_untar_"$TREE" "$(since "$t0")" s
  t0=$(now); ls -lR "$WORK/tree" >/dev/null; emit fs_ls_lR_"$TREE" "$(since "$t0")" s
  t0=$(now); du -s "$WORK/tree" >/dev/null; emit fs_du_s_"$TREE" "$(since "$t0")" s
  t0=$(now); rm -rf "$WORK/tree"; emit fs_rm_rf_"$TREE" "$(since "$t0")" s
fi
echo "# logs in $OUT"
}
