#!/usr/bin/env bash
# make bench: edgelink against its peers, side by side in one run: the CNI
# half (scripts/bench/cni.py), then the relay half (scripts/bench/relay.py).
# QUICK=1: one short round of each (CI checks that it runs, not the
# figures), and docs/benchmarks.md is left alone. Either way the run fails
# when edgelinkd loses connections or datagrams beyond the bounds, or
# edgelink's CHECK fails (scripts/bench/verdict.py); the peers' failures are
# only reported.
set -euo pipefail
cd "$(dirname "$0")/.."
[[ $(id -u) == 0 ]] || { echo "bench: run as root (network namespaces)" >&2; exit 1; }
# `make bench` builds the binaries (static, as shipped) and names them;
# run alone, this builds what is missing of the defaults (target/release).
if [[ -z ${FILL_BIN:-} ]]; then
    cargo build --release --examples -p edgelink-ipam >/dev/null
fi

cni=$(mktemp)
relay=$(mktemp)
trap 'rm -f "$cni" "$relay"' EXIT
if [[ -n ${QUICK:-} ]]; then
    python3 scripts/bench/cni.py --quick --out "$cni"
    python3 scripts/bench/relay.py --quick --out "$relay"
    echo "bench: QUICK=1 run finished (docs/benchmarks.md unchanged)"
    exit 0
fi
python3 scripts/bench/cni.py --out "$cni"
python3 scripts/bench/relay.py --out "$relay"
{
    cat docs/benchmarks.head.md
    echo
    cat "$cni"
    echo
    cat "$relay"
} > docs/benchmarks.md
echo "bench: wrote docs/benchmarks.md"
