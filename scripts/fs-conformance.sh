#!/usr/bin/env bash
# Runs pjdfstest and fsx against a mounted Kelp file system, when they are built beside the
# repository (see docs/FILESYSTEM.md, "Conformance"). Usage: scripts/fs-conformance.sh MOUNT
set -euo pipefail
mnt=${1:?usage: $0 MOUNT}
here=$(cd "$(dirname "$0")/.." && pwd)
beside=$(dirname "$here")
status=0
work="$mnt/conformance.$$"
mkdir -p "$work"
trap 'rm -rf "$work"' EXIT

if [ -x "$beside/pjdfstest/pjdfstest" ] && command -v prove >/dev/null; then
    echo "== pjdfstest (prove -r) in $work"
    (cd "$work" && prove -r "$beside/pjdfstest/tests") || status=1
else
    echo "== pjdfstest: not built at $beside/pjdfstest (skipped)"
fi

fsx=""
if [ -x "$beside/fsx/fsx" ]; then fsx="$beside/fsx/fsx"; elif command -v fsx >/dev/null; then fsx=$(command -v fsx); fi
if [ -n "$fsx" ]; then
    echo "== fsx -N 50000 -p 10000 -l 1048576"
    "$fsx" -N 50000 -p 10000 -l 1048576 "$work/fsx.file" || status=1
else
    echo "== fsx: not found at $beside/fsx/fsx or on PATH (skipped)"
fi
exit $status
