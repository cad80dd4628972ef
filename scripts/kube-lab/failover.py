#!/usr/bin/env python3
"""The client of the failover checks (F2-F4, issue 24): a loop of new TCP
connections and UDP request/reply through a Device's Service, each attempt
logged with its wall-clock time, and the figures of an outage read back
from the log.

    failover.py run HOST TCP_PORT UDP_PORT LOG STOPFILE [MAX_SECONDS]
        every 50 ms: a new TCP connection (1 s to connect, 64 bytes echoed
        back within 1 s), a UDP datagram on one socket kept all along (one
        flow: kube-proxy keeps it on one endpoint until that one goes), and
        a UDP datagram from a new socket each time (a new flow, as a new
        connection); a reply within 0.5 s. One line per attempt to LOG,
        "time kind ok|fail reason" (kind tcp, udp, udpnew), until STOPFILE
        exists or MAX_SECONDS (default 120) pass
        (UDP_PORT 0: the TCP loop alone, as a device dialling a reverse
        forward does)
    failover.py echo PORT STOPFILE [MAX_SECONDS]
        a TCP echo server on PORT (all addresses), one thread per
        connection: the cluster service a device calls through the
        Device's virtual address
    failover.py figures LOG EVENT [UNTIL]
        the outage an event at EVENT (Unix seconds, as `date +%s.%N`) made,
        up to UNTIL (default: the end of the log): one line
          tcp: N failed of M, every new connection works again after X s;
          udp: N lost of M, replies again after Y s; udpnew: ...;
          first failure after Z s
        "after X s" is the time from EVENT to the first attempt that worked
        after the last that failed (0 when none failed).

Used only inside the kube lab's network namespaces.
"""
import os
import socket
import sys
import threading
import time

PAYLOAD = b"x" * 63 + b"\n"


def tcp_once(host, port):
    with socket.create_connection((host, port), timeout=1.0) as s:
        s.settimeout(1.0)
        s.sendall(PAYLOAD)
        got = b""
        while len(got) < len(PAYLOAD):
            b = s.recv(4096)
            if not b:
                raise ConnectionError("eof")
            got += b
        if got != PAYLOAD:
            raise ConnectionError("mismatch")


def udp_once(sock, host, port, seq):
    msg = b"u%d\n" % seq
    sock.sendto(msg, (host, port))
    end = time.monotonic() + 0.5
    while True:
        left = end - time.monotonic()
        if left <= 0:
            raise TimeoutError("no reply")
        sock.settimeout(left)
        data, _ = sock.recvfrom(2048)
        if data == msg:
            return


def run(host, tcp_port, udp_port, log, stopfile, max_seconds):
    deadline = time.monotonic() + max_seconds
    lock = threading.Lock()
    out = open(log, "w", buffering=1)

    def write(kind, t, err):
        with lock:
            out.write("%.3f %s %s %s\n" % (t, kind, "ok" if err is None else "fail", err or "-"))

    def stopped():
        return os.path.exists(stopfile) or time.monotonic() > deadline

    def tcp_loop():
        while not stopped():
            t = time.time()
            err = None
            try:
                tcp_once(host, tcp_port)
            except Exception as e:  # every failure is a datum
                err = type(e).__name__
            write("tcp", t, err)
            time.sleep(0.05)

    def udp_loop(kind):
        fam = socket.AF_INET6 if ":" in host else socket.AF_INET
        s = socket.socket(fam, socket.SOCK_DGRAM)
        seq = 0
        while not stopped():
            seq += 1
            t = time.time()
            err = None
            if kind == "udpnew":
                s.close()
                s = socket.socket(fam, socket.SOCK_DGRAM)
            try:
                udp_once(s, host, udp_port, seq)
            except Exception as e:
                err = type(e).__name__
            write(kind, t, err)
            time.sleep(0.05)

    threads = [threading.Thread(target=tcp_loop)]
    if udp_port:
        threads += [
            threading.Thread(target=udp_loop, args=("udp",)),
            threading.Thread(target=udp_loop, args=("udpnew",)),
        ]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    out.close()


def echo(port, stopfile, max_seconds):
    deadline = time.monotonic() + max_seconds
    srv = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    srv.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    srv.bind(("0.0.0.0", port))
    srv.listen(128)
    srv.settimeout(0.5)

    def serve(c):
        with c:
            c.settimeout(5.0)
            try:
                while True:
                    b = c.recv(4096)
                    if not b:
                        return
                    c.sendall(b)
            except OSError:
                return

    while not os.path.exists(stopfile) and time.monotonic() < deadline:
        try:
            c, _ = srv.accept()
        except socket.timeout:
            continue
        threading.Thread(target=serve, args=(c,), daemon=True).start()


def figures(log, event, until=None):
    rows = []
    with open(log) as f:
        for line in f:
            p = line.split()
            if len(p) >= 3:
                rows.append((float(p[0]), p[1], p[2] == "ok"))
    parts = []
    first_fail = None
    for kind in ("tcp", "udp", "udpnew"):
        r = [x for x in rows if x[1] == kind and x[0] >= event and (until is None or x[0] <= until)]
        if not r and kind != "tcp":
            continue
        failed = [x for x in r if not x[2]]
        back = 0.0
        if failed:
            last = max(x[0] for x in failed)
            # the first attempt that worked after the last that failed
            ok_after = [x[0] for x in r if x[2] and x[0] > last]
            back = (min(ok_after) if ok_after else r[-1][0]) - event
            f0 = min(x[0] for x in failed) - event
            first_fail = f0 if first_fail is None else min(first_fail, f0)
        verb = "every new connection works again" if kind == "tcp" else "replies again"
        lost = "failed" if kind == "tcp" else "lost"
        parts.append("%s: %d %s of %d, %s after %.1f s" % (kind, len(failed), lost, len(r), verb, back))
    ff = "none failed" if first_fail is None else "first failure after %.1f s" % first_fail
    print("; ".join(parts) + "; " + ff)


def main():
    a = sys.argv[1:]
    if a and a[0] == "run" and len(a) >= 6:
        run(a[1], int(a[2]), int(a[3]), a[4], a[5], float(a[6]) if len(a) > 6 else 120.0)
    elif a and a[0] == "echo" and len(a) >= 3:
        echo(int(a[1]), a[2], float(a[3]) if len(a) > 3 else 600.0)
    elif a and a[0] == "figures" and len(a) >= 3:
        figures(a[1], float(a[2]), float(a[3]) if len(a) > 3 else None)
    else:
        sys.exit(__doc__)


if __name__ == "__main__":
    main()
