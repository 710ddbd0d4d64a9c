#!/usr/bin/env bash
# fio baselines for `kelp store bench` (docs/BENCHMARKS.md): same filesystem, same session.
# Usage: crates/kelp-store/scripts/fio_baseline.sh DIR [SECONDS]
# Prints one line per job: name, IOPS, MiB/s, p50/p99 completion latency (ms).
set -euo pipefail
dir=${1:?usage: fio_baseline.sh DIR [SECONDS]}
secs=${2:-10}
mkdir -p "$dir"
f="$dir/fio.dat"
common=(--filename="$f" --size=8G --runtime="$secs" --time_based --group_reporting
        --output-format=json)
# Lay the file out once (written, not sparse), so every job runs on allocated blocks.
fio --name=layout --filename="$f" --size=8G --rw=write --bs=4M --ioengine=libaio --direct=1 \
    --iodepth=4 --output=/dev/null
parser=$(mktemp)
trap 'rm -f "$parser"' EXIT
cat > "$parser" <<'PY'
import json, sys
j = json.load(sys.stdin)["jobs"][0]
for kind in ("write", "read"):
    d = j[kind]
    if d["io_bytes"] == 0:
        continue
    p = d["clat_ns"]["percentile"]
    print("%-36s %9.0f IOPS %8.1f MiB/s  p50 %7.3f ms  p99 %7.3f ms" % (
        j["jobname"], d["iops"], d["bw_bytes"] / 2**20,
        p["50.000000"] / 1e6, p["99.000000"] / 1e6))
PY
run() {
    local name=$1; shift
    fio --name="$name" "${common[@]}" "$@" | python3 "$parser"
}
run seqwrite_4m_direct_qd4   --rw=write     --bs=4M --ioengine=libaio --direct=1 --iodepth=4
run seqwrite_4m_direct_qd4_fdatasync4 --rw=write --bs=4M --ioengine=libaio --direct=1 --iodepth=4 --fdatasync=4
run randwrite_4k_fsync1_qd1  --rw=randwrite --bs=4k --ioengine=libaio --direct=1 --iodepth=1 --fsync=1
run randwrite_4k_fsync1_qd16 --rw=randwrite --bs=4k --ioengine=libaio --direct=1 --iodepth=16 --fsync=1
run randread_4k_direct_qd16  --rw=randread  --bs=4k --ioengine=libaio --direct=1 --iodepth=16
rm -f "$f"
