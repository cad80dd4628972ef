#!/usr/bin/env bash
# Which splice pipe size should edgelinkd use by default? Single-stream TCP
# throughput (iperf3, 5 s) and the daemon's CPU seconds per GB through the
# demo lab's "api" forward, with 64 KiB and 1 MiB pipes alternating A B A B,
# and the direct routed path (pod to device, no relay) for reference.
# docs/architecture.md records the result. Run as root after `make release`
# and `scripts/install-deps.sh bench`.
set -euo pipefail
cd "$(dirname "$0")/../.."
ROUNDS=${ROUNDS:-3} SECS=${SECS:-5}
DAEMON=target/release/edgelinkd
KEEP=1 EDGELINK_BIN=${EDGELINK_BIN:-target/release/edgelink} EDGELINKD_BIN=$DAEMON scripts/demo.sh > /dev/null
trap 'pkill -f "iperf3 -s -B 172.17.16.120" || true; scripts/demo.sh --down' EXIT
pkill -f "echo.py serve 172.17.16.120 8080" || true
ip netns exec elkdemo-device iperf3 -s -B 172.17.16.120 -p 8080 -D
sleep 0.3

cpu_of() { # utime+stime of a pid, in clock ticks
    awk '{print $14 + $15}' "/proc/$1/stat"
}
gbit() { python3 -c 'import json,sys; r=json.load(sys.stdin)["end"]; s=r["sum_received"]; print("%.2f %d" % (s["bits_per_second"]/1e9, s["bytes"]))'; }

for r in $(seq "$ROUNDS"); do
    out=$(ip netns exec elkdemo-pod iperf3 -J -c 172.17.16.120 -p 8080 -t "$SECS" | gbit)
    echo "round $r direct: $out Gbit/s bytes"
    for size in 65536 1048576; do
        pkill -f "edgelinkd run --state-dir /tmp/edgelink-demo" || true
        sleep 0.3
        ip netns exec elkdemo-node "$DAEMON" run --state-dir /tmp/edgelink-demo --status-addr 127.0.0.1:9310 \
            --log-level warn --pipe-size "$size" 2>/dev/null &
        pid=$!
        sleep 0.5
        before=$(cpu_of "$pid")
        read -r gbps bytes < <(ip netns exec elkdemo-client iperf3 -J -c 10.244.1.10 -p 8080 -t "$SECS" | gbit)
        after=$(cpu_of "$pid")
        cpu=$(python3 -c "import os; print('%.3f' % ((($after - $before) / os.sysconf('SC_CLK_TCK')) / ($bytes / 1e9)))")
        echo "round $r pipe $size: $gbps Gbit/s, $cpu CPU s/GB"
    done
done
