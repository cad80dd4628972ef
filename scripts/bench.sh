#!/usr/bin/env bash
# make bench: edgelink against its peers, side by side in one run.
# QUICK=1: one short round (CI checks that it runs, not the figures), and
# docs/benchmarks.md is left alone.
set -euo pipefail
cd "$(dirname "$0")/.."
[[ $(id -u) == 0 ]] || { echo "bench: run as root (network namespaces)" >&2; exit 1; }
cargo build --release --examples -p edgelink-ipam >/dev/null

out=$(mktemp)
trap 'rm -f "$out"' EXIT
if [[ -n ${QUICK:-} ]]; then
    python3 scripts/bench/cni.py --quick --out "$out"
    echo "bench: QUICK=1 run finished (docs/benchmarks.md unchanged)"
    exit 0
fi
python3 scripts/bench/cni.py --out "$out"
{
    cat docs/benchmarks.head.md
    echo
    cat "$out"
} > docs/benchmarks.md
echo "bench: wrote docs/benchmarks.md"
