"""What a relay costs beyond its throughput: the memory of many idle
connections (user space, the kernel's, the pipes held), and syscalls per
unit of work under strace."""
import errno
import os
import selectors
import signal
import socket
import subprocess
import time

from lab import CLIENT, ECHO, IDLE, IPERF, LOADGEN, UDP, in_ns, run_json, wait_for
from report import best_peer
from usage import forwarded, mem_kib, meminfo_kernel_kib, pipes_held, tree

SOCAT_IDLE_MAX = 2000  # socat forks a process per connection; 10 000 would use a third of pid_max


def hold_connections(host, port, n, deadline_s):
    """Open n TCP connections, one 64-byte exchange on each, keep them open.
    Runs on a thread inside the client netns; returns (sockets, failed)."""
    sel = selectors.DefaultSelector()
    held, failed, started, inflight = [], 0, 0, 0
    # socat listens with a backlog of 5: keep fewer connects in flight than that
    window = 4
    deadline = time.monotonic() + deadline_s
    msg = b"i" * 64
    while len(held) + failed < n and time.monotonic() < deadline:
        while inflight < window and started < n:
            try:
                c = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            except OSError:  # out of descriptors: keep what is open
                failed += n - started
                started = n
                break
            c.setblocking(False)
            err = c.connect_ex((host, port))
            if err not in (0, errno.EINPROGRESS):
                c.close()
                failed += 1
                started += 1
                continue
            sel.register(c, selectors.EVENT_WRITE, [0, time.monotonic()])
            started += 1
            inflight += 1
        for key, ev in sel.select(timeout=0.2):
            c, st = key.fileobj, key.data
            try:
                if st[0] == 0:
                    e = c.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR)
                    if e:
                        raise OSError(e, os.strerror(e))
                    c.send(msg)
                    st[0] = 1
                    sel.modify(c, selectors.EVENT_READ, st)
                else:
                    b = c.recv(64)
                    if not b:
                        raise OSError("closed")
                    st[0] += len(b)
                    if st[0] >= 65:
                        sel.unregister(c)
                        held.append(c)
                        inflight -= 1
            except OSError:
                sel.unregister(c)
                c.close()
                failed += 1
                inflight -= 1
        now = time.monotonic()
        for key in list(sel.get_map().values()):
            if now - key.data[1] > 10:  # one connection stuck for 10 s
                sel.unregister(key.fileobj)
                key.fileobj.close()
                failed += 1
                inflight -= 1
    for key in list(sel.get_map().values()):
        key.fileobj.close()
        failed += 1
    sel.close()
    return held, failed


def idle_memory(s, n):
    """User-space and kernel memory of n idle connections through s."""
    time.sleep(0.3)
    pids = s.pids()
    rss0, pss0 = mem_kib(pids)
    k0 = meminfo_kernel_kib()
    pipes0 = pipes_held(pids)
    t = time.monotonic()
    held, failed = in_ns(CLIENT, hold_connections, s.host, s.ports[IDLE], n, 90)
    took = time.monotonic() - t
    try:
        time.sleep(0.5)
        rss1, pss1 = mem_kib(pids)
        k1 = meminfo_kernel_kib()
        pipes1 = pipes_held(pids)
        procs_n = len(tree(pids))
    finally:
        for c in held:
            c.close()
    m = len(held)
    if m == 0:
        raise RuntimeError("no idle connection could be opened through %s (%d failed)" % (s.name, failed))
    out = {"idle_conns": m, "idle_failed": failed, "idle_open_s": took,
           "kernel_kib_conn": (k1 - k0) / m}
    if s.is_relay:
        out.update({"rss_kib_conn": (rss1 - rss0) / m, "pss_kib_conn": (pss1 - pss0) / m,
                    "pipes": pipes1[0], "pipe_mib": pipes1[1] / 2**20,
                    "pipes_added": pipes1[0] - pipes0[0], "procs": procs_n})
    # Let the relay close its side (socat: its children exit) before the
    # next subject is measured.
    if s.name == "socat":
        wait_for("socat's children to exit", lambda: len(tree(pids)) <= len(pids), timeout=30)
    time.sleep(0.5)
    return out


def strace_counts(pids, fn):
    """fn() with `strace -c -f` attached to the process tree: (fn's result,
    {syscall: [calls, errors]})."""
    argv = ["strace", "-c", "-f", "-qq"]
    for p in tree(pids):
        argv += ["-p", str(p)]
    st = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                          text=True, start_new_session=True)
    try:
        time.sleep(0.5)  # attached by then
        r = fn()
    finally:
        st.send_signal(signal.SIGINT)
        try:
            err = st.communicate(timeout=20)[1]
        except subprocess.TimeoutExpired:
            st.kill()
            err = st.communicate()[1]
    counts = {}
    for line in err.splitlines():
        c = line.split()
        if len(c) >= 5 and c[0][0].isdigit() and c[-1] != "total":
            calls = int(c[3])
            errors = int(c[4]) if len(c) == 6 else 0
            counts[c[-1]] = [calls, errors]
    return r, counts


def syscall_profiles(subjects, results, secs):
    """Syscalls per unit of work of edgelinkd and of the best peer, under
    strace -c -f (strace slows both; the counts per unit are what matter)."""
    t = secs["profile"]
    by = {s.name: s for s in subjects}

    def tcp(s):
        r = run_json(CLIENT, ["iperf3", "-J", "-c", s.host, "-p", str(s.ports[IPERF]), "-t", str(t)], t + 30)
        return r["end"]["sum_received"]["bytes"] / 1e6

    def conn(s):
        return run_json(CLIENT, [LOADGEN, "conn-rate", "%s:%d" % (s.host, s.ports[ECHO]), "--concurrency", "16",
                                 "--seconds", str(t)], t + 30)["connections"]

    def udp(s):
        f0 = forwarded()
        run_json(CLIENT, [LOADGEN, "udp", "%s:%d" % (s.host, s.ports[UDP]), "--rate", "100000", "--size", "1400",
                          "--seconds", str(t)], t + 30)
        return forwarded() - f0

    out = []
    for title, unit, fn, key, higher in (("TCP 1 stream", "MB", tcp, "gbps1", True),
                                         ("short connections", "connection", conn, "conn_s", True),
                                         ("UDP 100 000/s, 1 client", "datagram", udp, "u100_cpu_us", False)):
        _, peer = best_peer(results, subjects, key, higher)
        for name in ("edgelinkd", peer):
            if name is None:
                continue
            s = by[name]
            try:
                work, counts = strace_counts(s.pids(), lambda: fn(s))
            except (RuntimeError, subprocess.TimeoutExpired, KeyError) as e:
                print("  (syscall profile of %s, %s: %s)" % (name, title, e), flush=True)
                continue
            if not work:
                continue
            total = sum(c[0] for c in counts.values())
            top = sorted(counts.items(), key=lambda kv: -kv[1][0])[:8]
            out.append((title, name, unit, work, total / work,
                        ", ".join("%s %.2f%s" % (k, c / work, " (%d%% failed)" % (100 * e // c) if e else "")
                                  for k, (c, e) in top)))
            print("profile %s %s: %.2f syscalls per %s" % (title, name, total / work, unit), flush=True)
    return out
