#!/usr/bin/env python3
"""Tiny lab peers: a TCP echo server and a TCP round-trip client.

    echo.py serve HOST PORT          serve until killed (threads per client)
    echo.py ping HOST PORT [N]       N round trips of 64 bytes; prints
                                     "ok <bytes> <median-rtt-us>" or fails

Used by the demo and the tests only inside network namespaces they create.
"""
import socket
import statistics
import sys
import threading
import time


def serve(host, port):
    fam = socket.AF_INET6 if ":" in host else socket.AF_INET
    s = socket.socket(fam, socket.SOCK_STREAM)
    s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    s.bind((host, port))
    s.listen(128)

    def handle(c):
        with c:
            while True:
                b = c.recv(65536)
                if not b:
                    return
                c.sendall(b)

    while True:
        c, _ = s.accept()
        threading.Thread(target=handle, args=(c,), daemon=True).start()


def ping(host, port, n):
    fam = socket.AF_INET6 if ":" in host else socket.AF_INET
    c = socket.socket(fam, socket.SOCK_STREAM)
    c.settimeout(3)
    c.connect((host, port))
    c.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    msg = b"x" * 64
    rtts, total = [], 0
    for _ in range(n):
        t = time.perf_counter()
        c.sendall(msg)
        got = b""
        while len(got) < len(msg):
            chunk = c.recv(len(msg) - len(got))
            if not chunk:
                raise SystemExit("connection closed early")
            got += chunk
        rtts.append(time.perf_counter() - t)
        if got != msg:
            raise SystemExit("echo mismatch")
        total += len(got) * 2
    c.close()
    print("ok %d %d" % (total, statistics.median(rtts) * 1e6))


if __name__ == "__main__":
    if len(sys.argv) >= 4 and sys.argv[1] == "serve":
        serve(sys.argv[2], int(sys.argv[3]))
    elif len(sys.argv) >= 4 and sys.argv[1] == "ping":
        ping(sys.argv[2], int(sys.argv[3]), int(sys.argv[4]) if len(sys.argv) > 4 else 100)
    else:
        sys.exit(__doc__)
