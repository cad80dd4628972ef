#!/bin/sh
# The client side of `make e2e-vagrant`: runs in a pod on kworker1 (a python
# image; vagrant/e2e.sh mounts this file and scripts/lab/echo.py at /e2e) and
# reaches device01-01 through its Service, the way any pod in the cluster
# would: TCP echo, UDP echo, HTTP GET, each retried for up to ATTEMPTS x 3 s
# while the forwards come up. Prints one PASS or FAIL line per check and
# exits 1 if any failed.
#
#   e2e-client.sh HOST TCP_PORT UDP_PORT HTTP_PORT
set -eu
[ $# -eq 4 ] || { echo "usage: $0 HOST TCP_PORT UDP_PORT HTTP_PORT" >&2; exit 2; }
host=$1 tcp=$2 udp=$3 http=$4
ATTEMPTS=${ATTEMPTS:-20}
failed=0

# check NAME CLIENT PORT: echo.py's CLIENT (5 round trips), until it works.
check() {
    attempt=1
    while :; do
        if out=$(python3 /e2e/echo.py "$2" "$host" "$3" 5 2>&1); then
            # echo.py prints "ok <bytes> <median round trip in us>": split it.
            # shellcheck disable=SC2086
            set -- "$1" "$2" "$3" $out
            echo "PASS $1 $host:$3 ($5 bytes, median round trip $6 us, attempt $attempt)"
            return 0
        fi
        [ "$attempt" -lt "$ATTEMPTS" ] || break
        attempt=$((attempt + 1))
        sleep 3
    done
    echo "FAIL $1 $host:$3 after $ATTEMPTS attempts: $(echo "$out" | tail -n 1)"
    failed=$((failed + 1))
}

check tcp ping "$tcp"
check udp udp-ping "$udp"
check http http-get "$http"
[ "$failed" -eq 0 ]
