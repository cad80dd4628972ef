"""The device's services for the relay bench, run in the device netns:
iperf3, elk-loadgen's TCP echo, and two echoes in Python started as
`python3 device.py _udp-echo HOST PORT` / `_idle-echo HOST PORT`.
"""
import os
import selectors
import socket
import sys
import time

from lab import CLOSE, CLOSE_REQUEST, DEV, DEV_IP, ECHO, IDLE, IPERF, LOADGEN, UDP, listening, wait_for


def helper_udp_echo(host, port):
    """UDP echo as fast as a plain Python loop goes (one recv, one send)."""
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    s.setsockopt(socket.SOL_SOCKET, 33, 8 << 20)  # SO_RCVBUFFORCE
    s.setsockopt(socket.SOL_SOCKET, 32, 8 << 20)  # SO_SNDBUFFORCE
    s.bind((host, int(port)))
    buf = bytearray(65536)
    mv = memoryview(buf)
    recv, send = s.recvfrom_into, s.sendto
    while True:
        n, peer = recv(buf)
        try:
            send(mv[:n], peer)
        except OSError:
            pass


def helper_idle_echo(host, port):
    """TCP echo on epoll for many mostly idle connections."""
    ls = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    ls.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    ls.bind((host, int(port)))
    ls.listen(4096)
    ls.setblocking(False)
    sel = selectors.DefaultSelector()
    sel.register(ls, selectors.EVENT_READ, None)
    while True:
        for key, _ in sel.select():
            if key.data is None:
                while True:
                    try:
                        c, _ = ls.accept()
                    except (BlockingIOError, InterruptedError):
                        break
                    except OSError:
                        time.sleep(0.01)
                        break
                    c.setblocking(False)
                    sel.register(c, selectors.EVENT_READ, 1)
                continue
            c = key.fileobj
            try:
                b = c.recv(65536)
            except (BlockingIOError, InterruptedError):
                continue
            except OSError:
                b = b""
            if not b:
                sel.unregister(c)
                c.close()
                continue
            try:
                c.send(b)  # small echoes: the send buffer always has room
            except OSError:
                sel.unregister(c)
                c.close()


HELPERS = {"_udp-echo": helper_udp_echo, "_idle-echo": helper_idle_echo}


def start(procs):
    """iperf3, the TCP echo, the UDP echo, the idle echo and the closing
    echo on the device,
    each listening before this returns: {service: process}."""
    me = os.path.abspath(__file__)
    device = {"iperf": procs.start("iperf3-server", DEV, ["iperf3", "-s", "-B", DEV_IP, "-p", str(IPERF)]),
              "echo": procs.start("echo-server", DEV, [LOADGEN, "echo-server", "%s:%d" % (DEV_IP, ECHO)]),
              "udp": procs.start("udp-echo", DEV, [sys.executable, me, "_udp-echo", DEV_IP, str(UDP)]),
              "idle": procs.start("idle-echo", DEV, [sys.executable, me, "_idle-echo", DEV_IP, str(IDLE)]),
              "close": procs.start("closing-echo", DEV, [LOADGEN, "echo-server", "%s:%d" % (DEV_IP, CLOSE),
                                                         "--close-after", str(CLOSE_REQUEST)])}
    for svc, port, proto in (("iperf", IPERF, "tcp"), ("echo", ECHO, "tcp"), ("udp", UDP, "udp"), ("idle", IDLE, "tcp"),
                             ("close", CLOSE, "tcp")):
        wait_for("device %s on %s port %d" % (svc, proto, port), lambda: listening(DEV, port, proto),
                 device[svc], procs)
    return device


if __name__ == "__main__":
    HELPERS[sys.argv[1]](*sys.argv[2:])
