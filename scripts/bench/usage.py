"""What a process tree uses (CPU, memory, pipes, from /proc) and the
kernel's counters (memory, UDP) that the measures read before and after.
"""
import ctypes
import os

from lab import CLIENT, DEV, in_ns, proc_stats

CLK = os.sysconf("SC_CLK_TCK")
libc = ctypes.CDLL("libc.so.6", use_errno=True)
SYS_PIDFD_GETFD = 438
F_GETPIPE_SZ = 1032


def proc_table():
    """pid -> (ppid, utime+stime+cutime+cstime ticks)."""
    out = {}
    for pid, f in proc_stats():
        out[pid] = (int(f[1]), int(f[11]) + int(f[12]) + int(f[13]) + int(f[14]))
    return out


def tree(roots, table=None):
    table = table if table is not None else proc_table()
    kids = {}
    for pid, (ppid, _) in table.items():
        kids.setdefault(ppid, []).append(pid)
    seen, todo = [], [r for r in roots if r in table]
    while todo:
        p = todo.pop()
        seen.append(p)
        todo.extend(kids.get(p, []))
    return seen


def cpu_seconds(roots):
    """CPU seconds of a process tree: every live process's own time and the
    time of its reaped children (so children that came and went between two
    readings are counted, as long as they were reaped)."""
    table = proc_table()
    return sum(table[p][1] for p in tree(roots, table)) / CLK


def mem_kib(roots):
    """(sum of VmRSS, sum of Pss) of a process tree, KiB."""
    rss = pss = 0
    for p in tree(roots):
        try:
            with open("/proc/%d/status" % p) as f:
                for line in f:
                    if line.startswith("VmRSS:"):
                        rss += int(line.split()[1])
            with open("/proc/%d/smaps_rollup" % p) as f:
                for line in f:
                    if line.startswith("Pss:"):
                        pss += int(line.split()[1])
        except OSError:
            pass
    return rss, pss


def pipes_held(roots):
    """(pipes, capacity bytes) held by a process tree: pipe descriptors from
    /proc/PID/fd, sizes with pidfd_getfd + F_GETPIPE_SZ where the kernel allows."""
    seen, cap = set(), 0
    for p in tree(roots):
        try:
            fds = os.listdir("/proc/%d/fd" % p)
        except OSError:
            continue
        pidfd = None
        for fd in fds:
            try:
                link = os.readlink("/proc/%d/fd/%s" % (p, fd))
            except OSError:
                continue
            if not link.startswith("pipe:") or link in seen:
                continue
            seen.add(link)
            try:
                if pidfd is None:
                    pidfd = os.pidfd_open(p)
                mine = libc.syscall(SYS_PIDFD_GETFD, pidfd, int(fd), 0)
                if mine >= 0:
                    import fcntl
                    cap += fcntl.fcntl(mine, F_GETPIPE_SZ)
                    os.close(mine)
            except (OSError, AttributeError):
                pass
        if pidfd is not None:
            os.close(pidfd)
    return len(seen), cap


def meminfo_kernel_kib():
    """Slab + KernelStack + PageTables from /proc/meminfo (KiB)."""
    want = {"Slab:", "KernelStack:", "PageTables:"}
    total = 0
    with open("/proc/meminfo") as f:
        for line in f:
            k = line.split()
            if k[0] in want:
                total += int(k[1])
    return total


def snmp(ns):
    """The Udp counters of a netns."""
    def read():
        with open("/proc/thread-self/net/snmp") as f:
            lines = [l.split() for l in f if l.startswith("Udp:")]
        return dict(zip(lines[0][1:], map(int, lines[1][1:])))
    return in_ns(ns, read)


def forwarded():
    """Datagrams a relay in the pod passed on, both ways: those the device
    and the client received (Udp InDatagrams of their netns). Counted at
    the receivers, since a relay that sends with UDP GSO makes one
    OutDatagrams of many datagrams."""
    return snmp(DEV)["InDatagrams"] + snmp(CLIENT)["InDatagrams"]
