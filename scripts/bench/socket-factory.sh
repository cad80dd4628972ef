#!/usr/bin/env bash
# How should upstream sockets be made inside the pod's netns? Measures the
# short-connection rate through a TCP forward with the per-netns factory
# making each socket on demand (--socket-pool 0) against keeping a small
# ready pool (--socket-pool 16), alternating A B A B in one run.
# docs/architecture.md records the result. Run as root after `make release`.
set -euo pipefail
cd "$(dirname "$0")/../.."
ROUNDS=${ROUNDS:-3} SECS=${SECS:-4}
LOADGEN=target/release/elk-loadgen DAEMON=target/release/edgelinkd
KEEP=1 EDGELINK_BIN=${EDGELINK_BIN:-target/release/edgelink} EDGELINKD_BIN=$DAEMON scripts/demo.sh > /dev/null
trap 'scripts/demo.sh --down' EXIT
# The demo's "api" forward (pod :8080 -> device :8080), with a fast echo
# peer on the device instead of the python one, and TIME_WAIT reuse where
# connections are opened so that thousands of short connections per second
# do not run out of ports (the same for both subjects).
pkill -f "echo.py serve 172.17.16.120 8080" || true
ip netns exec elkdemo-device "$LOADGEN" echo-server 172.17.16.120:8080 &
for ns in elkdemo-pod elkdemo-client; do ip netns exec $ns sysctl -qw net.ipv4.tcp_tw_reuse=1; done
for r in $(seq "$ROUNDS"); do
    for pool in 0 16; do
        pkill -f "edgelinkd run --state-dir /tmp/edgelink-demo" || true
        sleep 0.3
        ip netns exec elkdemo-node "$DAEMON" run --state-dir /tmp/edgelink-demo --status-addr 127.0.0.1:9310 \
            --log-level warn --socket-pool "$pool" 2>/dev/null &
        for _ in $(seq 100); do
            ip netns exec elkdemo-client "$LOADGEN" conn-rate 10.244.1.10:8080 --concurrency 1 --seconds 0.05 \
                | grep -q '"connections":[1-9]' && break
            sleep 0.05
        done
        out=$(ip netns exec elkdemo-client "$LOADGEN" conn-rate 10.244.1.10:8080 --concurrency 16 --seconds "$SECS")
        echo "round $r socket-pool $pool $out"
    done
done
pkill -f "elk-loadgen echo-server 172.17.16.120:8080" || true
