#!/usr/bin/env bash
# Install the Debian packages the tests and benchmarks need.
#
#   scripts/install-deps.sh [test|bench|demo|soak|all]...     (default: test)
#
# test   iproute2, nftables (the kernel path), containernetworking-plugins,
#        podman, runc, busybox-static,
#        vagrant and shellcheck (scripts/check-vagrant.sh; no hypervisor),
#        haproxy and nginx (the PROXY protocol receivers of the daemon tests)
#        (+ python3, normally present already)
# bench  socat, haproxy, nginx, libnginx-mod-stream, iperf3, wrk, strace,
#        nftables (edgelinkd's kernel path subject)
# demo   iproute2, nftables, python3 (scripts/demo.sh)
# soak   iproute2, python3, python3-matplotlib (the figures), hping3 (the
#        SYN flood) (make soak, make chaos)
# all    all of them
#
# Idempotent and quick when everything is installed: each package is checked
# with dpkg first; `apt-get update` runs at most once, and only when something
# is missing. Runs as root, without a terminal or stdin (CI). Services that
# packages ship (nginx, haproxy, iperf3) are never started by the install.
# Prints one line per group.
set -euo pipefail

readonly TEST_PKGS=(iproute2 nftables containernetworking-plugins podman runc busybox-static shellcheck vagrant haproxy nginx python3)
readonly BENCH_PKGS=(socat haproxy nginx libnginx-mod-stream iperf3 wrk strace nftables)
readonly DEMO_PKGS=(iproute2 nftables python3)
readonly SOAK_PKGS=(iproute2 python3 python3-matplotlib hping3)

usage() {
    sed -n '2,22p' "$0" | sed 's/^# \{0,1\}//'
}

# "install ok installed" only for a fully installed package. No pipe into
# grep -q here: under pipefail, dpkg's SIGPIPE would make it fail at random.
is_installed() {
    local status
    status=$(dpkg-query -W -f='${Status}' "$1" 2>/dev/null) || return 1
    [[ $status == "install ok installed" ]]
}

APT_UPDATED=0
POLICY_RC_CREATED=0

cleanup() {
    if [[ $POLICY_RC_CREATED == 1 ]]; then
        rm -f /usr/sbin/policy-rc.d
    fi
}
trap cleanup EXIT

apt_install() {
    if [[ $(id -u) != 0 ]]; then
        echo "install-deps: must run as root to install: $*" >&2
        exit 1
    fi
    # Keep package maintainer scripts from starting daemons (nginx on :80,
    # haproxy, iperf3): Debian's invoke-rc.d honours policy-rc.d exit 101.
    # Docker-style images already ship one; otherwise add it for this run only.
    if [[ ! -e /usr/sbin/policy-rc.d ]]; then
        printf '#!/bin/sh\nexit 101\n' > /usr/sbin/policy-rc.d
        chmod 0755 /usr/sbin/policy-rc.d
        POLICY_RC_CREATED=1
    fi
    export DEBIAN_FRONTEND=noninteractive
    local apt_opts=(-q -o Dpkg::Use-Pty=0 -o DPkg::Lock::Timeout=300)
    if [[ $APT_UPDATED == 0 ]]; then
        apt-get "${apt_opts[@]}" update </dev/null >/dev/null
        APT_UPDATED=1
    fi
    apt-get "${apt_opts[@]}" install -y --no-install-recommends "$@" </dev/null >/dev/null
}

install_group() {
    local group=$1
    shift
    local missing=() pkg
    for pkg in "$@"; do
        is_installed "$pkg" || missing+=("$pkg")
    done
    if [[ ${#missing[@]} -eq 0 ]]; then
        echo "install-deps: $group: all $# packages already installed"
        return
    fi
    local start=$SECONDS
    apt_install "${missing[@]}"
    for pkg in "${missing[@]}"; do
        if ! is_installed "$pkg"; then
            echo "install-deps: $group: $pkg is still not installed" >&2
            exit 1
        fi
    done
    echo "install-deps: $group: installed ${missing[*]} ($((SECONDS - start)) s)"
}

main() {
    local groups=("$@") g want_test=0 want_bench=0 want_demo=0 want_soak=0
    [[ ${#groups[@]} -gt 0 ]] || groups=(test)
    for g in "${groups[@]}"; do
        case $g in
        test) want_test=1 ;;
        bench) want_bench=1 ;;
        demo) want_demo=1 ;;
        soak) want_soak=1 ;;
        all) want_test=1 want_bench=1 want_demo=1 want_soak=1 ;;
        -h | --help)
            usage
            exit 0
            ;;
        *)
            echo "install-deps: unknown group '$g'" >&2
            usage >&2
            exit 2
            ;;
        esac
    done
    [[ $want_test == 0 ]] || install_group test "${TEST_PKGS[@]}"
    [[ $want_bench == 0 ]] || install_group bench "${BENCH_PKGS[@]}"
    [[ $want_demo == 0 ]] || install_group demo "${DEMO_PKGS[@]}"
    [[ $want_soak == 0 ]] || install_group soak "${SOAK_PKGS[@]}"
}

main "$@"
