#!/usr/bin/env python3
"""Load for e2e check 8 (DaemonSet update under load): N long TCP connections
to an echo service, each sending a small message every 0.2 s and reading it
back, plus a loop opening short connections one after another.

    longconns.py HOST PORT N STOPFILE [MAX_SECONDS]

Runs until STOPFILE exists (or MAX_SECONDS, default 120), then prints one
line:

    long N: established E, dropped D; new: ok A, refused R, failed F

A long connection counts as dropped at its first error (reset, EOF, wrong
echo, 2 s without an answer) and is not reopened. A new connection is
"refused" on ECONNREFUSED or a reset before the echo, "failed" on any other
error or timeout. Used only inside the kube lab's network namespaces.
"""
import os
import socket
import sys
import threading
import time

host, port, n, stopfile = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
deadline = time.monotonic() + (float(sys.argv[5]) if len(sys.argv) > 5 else 120.0)
lock = threading.Lock()
counts = {"established": 0, "dropped": 0, "ok": 0, "refused": 0, "failed": 0}


def stopped():
    return os.path.exists(stopfile) or time.monotonic() > deadline


def bump(k):
    with lock:
        counts[k] += 1


def long_conn(i):
    try:
        s = socket.create_connection((host, port), timeout=2)
    except OSError:
        bump("dropped")
        return
    bump("established")
    seq = 0
    with s:
        while not stopped():
            msg = b"long-%03d-%08d\n" % (i, seq)
            try:
                s.sendall(msg)
                got = b""
                while len(got) < len(msg):
                    b = s.recv(len(msg) - len(got))
                    if not b:
                        raise OSError("eof")
                    got += b
                if got != msg:
                    raise OSError("mismatch")
            except OSError:
                bump("dropped")
                return
            seq += 1
            time.sleep(0.2)


def new_conns():
    while not stopped():
        try:
            with socket.create_connection((host, port), timeout=1) as s:
                s.settimeout(1)
                s.sendall(b"new\n")
                if s.recv(16) != b"new\n":
                    raise ConnectionResetError()
            bump("ok")
        except (ConnectionRefusedError, ConnectionResetError):
            bump("refused")
        except OSError:
            bump("failed")
        time.sleep(0.05)


threads = [threading.Thread(target=long_conn, args=(i,)) for i in range(n)]
threads.append(threading.Thread(target=new_conns))
for t in threads:
    t.start()
for t in threads:
    t.join()
c = counts
print("long %d: established %d, dropped %d; new: ok %d, refused %d, failed %d"
      % (n, c["established"], c["dropped"], c["ok"], c["refused"], c["failed"]))
