#!/usr/bin/env bash
# device01-01: the device on the private segment, serving what the netns
# lab's device serves (make demo), with the same program (scripts/lab/echo.py,
# uploaded by the Vagrantfile): TCP echo on 8080, UDP echo on 5000, HTTP on
# 80 answering GET with "device01-01: ...". One systemd unit each, restarted
# on failure and at boot.
#
# Env: DEVICE_IP (for the closing check), ECHO_PY (the uploaded echo.py);
# TCP_PORT, UDP_PORT, HTTP_PORT override the ports. Runs as root; safe to
# run again.
set -euo pipefail
: "${DEVICE_IP:?}" "${ECHO_PY:?}"
TCP_PORT=${TCP_PORT:-8080} UDP_PORT=${UDP_PORT:-5000} HTTP_PORT=${HTTP_PORT:-80}
LIB=/usr/local/lib/edgelink-lab
export DEBIAN_FRONTEND=noninteractive

say() { echo "device: $*"; }

if ! command -v python3 >/dev/null; then
    say "installing python3"
    apt-get -q -o DPkg::Lock::Timeout=300 update >/dev/null
    apt-get -q -o DPkg::Lock::Timeout=300 install -y --no-install-recommends python3 >/dev/null
fi
install -d -m 0755 "$LIB"
install -m 0755 "$ECHO_PY" "$LIB/echo.py"

# unit NAME WHAT ARGS...: a service running echo.py ARGS.
unit() {
    local name=$1 what=$2
    shift 2
    cat > "/etc/systemd/system/$name.service" <<EOF
# edgelink lab (vagrant/provision/device.sh)
[Unit]
Description=device01-01: $what
After=network.target

[Service]
ExecStart=/usr/bin/python3 $LIB/echo.py $*
DynamicUser=yes
AmbientCapabilities=CAP_NET_BIND_SERVICE
Restart=always
RestartSec=1

[Install]
WantedBy=multi-user.target
EOF
}

unit device-tcp-echo "TCP echo on $TCP_PORT" serve 0.0.0.0 "$TCP_PORT"
unit device-udp-echo "UDP echo on $UDP_PORT" serve-udp 0.0.0.0 "$UDP_PORT"
unit device-http "HTTP on $HTTP_PORT" serve-http 0.0.0.0 "$HTTP_PORT"
systemctl daemon-reload
for name in device-tcp-echo device-udp-echo device-http; do
    systemctl enable "$name.service" >/dev/null 2>&1
    systemctl restart "$name.service"
done

say "checking from the device itself"
for check in "ping $TCP_PORT" "udp-ping $UDP_PORT" "http-get $HTTP_PORT"; do
    read -r client port <<<"$check"
    for attempt in 1 2 3 4 5 6 7 8 9 10; do
        if out=$(python3 "$LIB/echo.py" "$client" "$DEVICE_IP" "$port" 3 2>&1); then
            say "$client $DEVICE_IP:$port: $out"
            break
        fi
        if ((attempt == 10)); then
            echo "device: $client $DEVICE_IP:$port failed: $out" >&2
            exit 1
        fi
        sleep 1
    done
done
say "device01-01 serves TCP $TCP_PORT, UDP $UDP_PORT, HTTP $HTTP_PORT on $DEVICE_IP"
