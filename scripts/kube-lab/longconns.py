#!/usr/bin/env python3
"""Load for e2e check 8 (DaemonSet update under load): N long TCP connections
to an echo service, each sending a small message every 0.2 s and reading it
back, plus a loop opening short connections one after another.

    longconns.py HOST PORT N STOPFILE [MAX_SECONDS]

Runs until STOPFILE exists (or MAX_SECONDS, default 120), then prints one
line:

    long N: established E, dropped D (REASONS); new: ok A, refused R, failed F;
    longest gap G ms; echoes on long connections X

(on one line). A long connection counts as dropped at its first error
(reset, eof, mismatch: a wrong echo, timeout: 2 s without an answer; REASONS
counts them, "-" when none) and is not reopened. A new connection is
"refused" on ECONNREFUSED or a reset before the echo, "failed" on any other
error or timeout. The longest gap is the longest time between two new
connections that worked, one after the other (the loop pauses 50 ms between
tries, so about 60 ms when nothing fails): how long the forward did not take
new connections. Used only inside the kube lab's network namespaces.
"""
import os
import socket
import sys
import threading
import time

host, port, n, stopfile = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
deadline = time.monotonic() + (float(sys.argv[5]) if len(sys.argv) > 5 else 120.0)
lock = threading.Lock()
counts = {"established": 0, "dropped": 0, "ok": 0, "refused": 0, "failed": 0, "echoes": 0}
reasons = {}
gap = {"last_ok": None, "longest": 0.0}


def stopped():
    return os.path.exists(stopfile) or time.monotonic() > deadline


def bump(k):
    with lock:
        counts[k] += 1


def drop(reason):
    with lock:
        counts["dropped"] += 1
        reasons[reason] = reasons.get(reason, 0) + 1


def long_conn(i):
    try:
        s = socket.create_connection((host, port), timeout=2)
    except OSError:
        drop("connect")
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
                        raise EOFError()
                    got += b
                if got != msg:
                    drop("mismatch")
                    return
            except EOFError:
                drop("eof")
                return
            except socket.timeout:
                drop("timeout")
                return
            except (ConnectionResetError, BrokenPipeError):
                drop("reset")
                return
            except OSError as e:
                drop(type(e).__name__)
                return
            bump("echoes")
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
            now = time.monotonic()
            with lock:
                if gap["last_ok"] is not None:
                    gap["longest"] = max(gap["longest"], now - gap["last_ok"])
                gap["last_ok"] = now
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
why = ", ".join("%s %d" % kv for kv in sorted(reasons.items())) or "-"
print("long %d: established %d, dropped %d (%s); new: ok %d, refused %d, failed %d; "
      "longest gap %d ms; echoes on long connections %d"
      % (n, c["established"], c["dropped"], why, c["ok"], c["refused"], c["failed"],
         round(gap["longest"] * 1000), c["echoes"]))
