#!/usr/bin/env bash
# Run the cargo-fuzz targets (fuzz/), each for a bounded time; `make fuzz`.
#
#   scripts/fuzz.sh [target...]        (default: every target)
#
# FUZZ_SECONDS  run time per target (default 60; -max_total_time)
# FUZZ_RSS_MB   libFuzzer's memory limit per target (default 2048)
# FUZZ_JOBS     targets run at a time (default 1)
# FUZZ_DEV=1    build and run without optimizations (cargo fuzz --dev): the
#               build takes ~1.5 min instead of ~8.5 on 2 cores, the runs
#               make ~3x fewer execs; for CI's short smoke runs
# FUZZ_MAX_LEN  longest input tried (default 16384 bytes for a config, a
#               Result or a record, which may list dozens of forwards;
#               4096 for a control line and CNI_ARGS, which are far shorter)
#
# Works with the stable toolchain alone: cargo-fuzz's nightly flags
# (-Zsanitizer=address and the sancov passes) are allowed by
# RUSTC_BOOTSTRAP=1, and the address sanitizer's runtime ships with the
# stable standard library on x86_64-unknown-linux-gnu.
#
# Each target starts from its committed seeds (fuzz/seeds/<target>/,
# scripts/fuzz-seeds.py) plus whatever earlier runs added to
# fuzz/corpus/<target>/ (not committed). A crash's input is written to
# fuzz/artifacts/<target>/; reproduce it with
#   RUSTC_BOOTSTRAP=1 cargo fuzz run --fuzz-dir fuzz <target> <file>
# Prints one line per target; exits 1 if any target crashed.
set -euo pipefail
cd "$(dirname "$0")/.."

CARGO=${CARGO:-cargo}
SECONDS_EACH=${FUZZ_SECONDS:-60}
RSS_MB=${FUZZ_RSS_MB:-2048}
ALL=(netconf result record control cni_args handover)
TARGETS=("$@")
[[ ${#TARGETS[@]} -gt 0 ]] || TARGETS=("${ALL[@]}")

export RUSTC_BOOTSTRAP=1
scripts/install-cargo-fuzz.sh
MODE=()
[[ ${FUZZ_DEV:-0} == 1 ]] && MODE=(--dev)
# Every target at once, before any clock starts.
$CARGO fuzz build "${MODE[@]}" --fuzz-dir fuzz

mkdir -p fuzz/logs
# One target: its run, then its line in fuzz/logs/<target>.line and, if it
# crashed, fuzz/logs/<target>.failed.
run_one() {
    local t=$1 log="fuzz/logs/$1.log" before max_len rc=0 last execs secs cov ft corp crashes rate
    mkdir -p "fuzz/corpus/$t" "fuzz/artifacts/$t"
    rm -f "fuzz/logs/$t.failed"
    before=$(find "fuzz/artifacts/$t" -type f | wc -l)
    case $t in
        control | cni_args) max_len=${FUZZ_MAX_LEN:-4096} ;;
        handover) max_len=${FUZZ_MAX_LEN:-65536} ;;
        *) max_len=${FUZZ_MAX_LEN:-16384} ;;
    esac
    $CARGO fuzz run "${MODE[@]}" --fuzz-dir fuzz "$t" "fuzz/corpus/$t" "fuzz/seeds/$t" -- \
        -max_total_time="$SECONDS_EACH" -rss_limit_mb="$RSS_MB" -max_len="$max_len" \
        -timeout=10 -print_final_stats=1 >"$log" 2>&1 || rc=$?
    # The last status line: "#N DONE cov: C ft: F corp: U/S lim: L exec/s: E rss: R".
    last=$(grep -E '^#[0-9]+' "$log" | tail -n 1 || true)
    execs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$log" | tail -n 1)
    secs=$(sed -n 's/^Done [0-9]* runs in \([0-9]*\) second.*/\1/p' "$log" | tail -n 1)
    cov=$(sed -n 's/.* cov: \([0-9]*\).*/\1/p' <<<"$last")
    ft=$(sed -n 's/.* ft: \([0-9]*\).*/\1/p' <<<"$last")
    corp=$(sed -n 's/.* corp: \([0-9]*\)\/.*/\1/p' <<<"$last")
    crashes=$(( $(find "fuzz/artifacts/$t" -type f | wc -l) - before ))
    rate=$(( ${execs:-0} / (${secs:-0} > 0 ? ${secs:-1} : 1) ))
    {
        echo "fuzz: $t: ${execs:-?} execs in ${secs:-?} s (${rate}/s), cov ${cov:-?}, ft ${ft:-?}, corpus ${corp:-?}, crashes $crashes (rc $rc, log $log)"
        if [[ $rc -ne 0 || $crashes -ne 0 ]]; then
            grep -E 'panicked at|ERROR: |SUMMARY|Test unit written to' "$log" | head -n 5 | sed 's/^/    /'
            touch "fuzz/logs/$t.failed"
        fi
    } >"fuzz/logs/$t.line"
}
# FUZZ_JOBS targets at a time (default 1; CI: one per core).
jobs_max=${FUZZ_JOBS:-1}
for t in "${TARGETS[@]}"; do
    while [[ $(jobs -rp | wc -l) -ge $jobs_max ]]; do wait -n || true; done
    run_one "$t" &
done
wait
failed=()
for t in "${TARGETS[@]}"; do
    cat "fuzz/logs/$t.line"
    [[ -e fuzz/logs/$t.failed ]] && failed+=("$t")
done
if [[ ${#failed[@]} -gt 0 ]]; then
    echo "fuzz: crashed: ${failed[*]} (inputs in fuzz/artifacts/)" >&2
    exit 1
fi
