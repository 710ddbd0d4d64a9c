#!/usr/bin/env bash
# Interleaved comparison of `kelp store bench` with fio on the same filesystem, for shared VMs
# whose speed drifts: each round runs every fio job immediately followed by the matching kelp
# test, so each pair sees the same conditions; docs/BENCHMARKS.md quotes per-pair ratios and
# medians. Then one full-length ingest (1M objects) and the complete default bench.
# Usage: crates/kelp-store/scripts/bench_vs_fio.sh KELP_BINARY DIR [ROUNDS] [SECONDS]
set -euo pipefail
kelp=${1:?usage: bench_vs_fio.sh KELP_BINARY DIR [ROUNDS] [SECONDS]}
dir=${2:?usage: bench_vs_fio.sh KELP_BINARY DIR [ROUNDS] [SECONDS]}
rounds=${3:-3}
secs=${4:-5}
mkdir -p "$dir"
f="$dir/fio.dat"
parser=$(mktemp)
trap 'rm -f "$parser" "$f"' EXIT
cat > "$parser" <<'PY'
import json, sys
j = json.load(sys.stdin)["jobs"][0]
for kind in ("write", "read"):
    d = j[kind]
    if d["io_bytes"] == 0:
        continue
    p = d["clat_ns"]["percentile"]
    print("fio  %-34s %9.0f ops/s %8.1f MiB/s  p50 %7.3f ms  p99 %7.3f ms" % (
        j["jobname"], d["iops"], d["bw_bytes"] / 2**20,
        p["50.000000"] / 1e6, p["99.000000"] / 1e6))
PY
fio --name=layout --filename="$f" --size=8G --rw=write --bs=4M --ioengine=libaio --direct=1 \
    --iodepth=4 --output=/dev/null
fiojob() {
    local name=$1; shift
    fio --name="$name" --filename="$f" --size=8G --runtime="$secs" --time_based \
        --group_reporting --output-format=json "$@" | python3 "$parser"
}
kelpjob() {
    rm -rf "$dir/kb"
    local out
    if ! out=$("$kelp" store bench "$dir/kb" --seconds "$secs" --only "$1" 2>&1); then
        echo "kelp FAILED: $out"
        return 0
    fi
    echo "$out" | grep ' qd ' | sed 's/^/kelp /'
}
for r in $(seq 1 "$rounds"); do
    echo "== round $r $(date -u +%H:%M:%S) load $(cut -d' ' -f1 /proc/loadavg)"
    fiojob seqwrite_4m_direct_qd4 --rw=write --bs=4M --ioengine=libaio --direct=1 --iodepth=4
    fiojob seqwrite_4m_direct_qd4_fdatasync4 --rw=write --bs=4M --ioengine=libaio --direct=1 \
        --iodepth=4 --fdatasync=4
    kelpjob write_4m_qd4
    fiojob randwrite_4k_fsync1_qd1 --rw=randwrite --bs=4k --ioengine=libaio --direct=1 \
        --iodepth=1 --fsync=1
    kelpjob write_4k_new_qd1,overwrite_4k_qd1
    fiojob randwrite_4k_fsync1_qd16 --rw=randwrite --bs=4k --ioengine=libaio --direct=1 \
        --iodepth=16 --fsync=1
    kelpjob write_4k_new_qd16,overwrite_4k_qd16
    fiojob randread_4k_direct_qd16 --rw=randread --bs=4k --ioengine=libaio --direct=1 --iodepth=16
    kelpjob randread_4k_qd16_cold
done
rm -f "$f"
echo "== full bench (default: 1M-object ingest) $(date -u +%H:%M:%S) load $(cut -d' ' -f1 /proc/loadavg)"
rm -rf "$dir/kb"
"$kelp" store bench "$dir/kb" --seconds "$secs" --format json > "$dir/bench.json"
cat "$dir/bench.json"
echo "== done $(date -u +%H:%M:%S) load $(cut -d' ' -f1 /proc/loadavg)"
