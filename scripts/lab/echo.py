#!/usr/bin/env python3
"""Tiny lab peers: TCP and UDP echo servers, an HTTP server, and clients.

    echo.py serve HOST PORT          TCP echo until killed (thread per client)
    echo.py serve-udp HOST PORT      UDP echo until killed
    echo.py serve-http HOST PORT     HTTP server answering GET with a page
    echo.py serve-collect HOST PORT  a collector (stands in for an MQTT
                                     broker): prints "from PEER: LINE" for
                                     each line it receives, answers "ack"
    echo.py ping HOST PORT [N]       N TCP round trips of 64 bytes; prints
                                     "ok <bytes> <median-rtt-us>" or fails;
                                     bytes: the client's payload both ways
                                     (what a relay's byte counters count)
    echo.py udp-ping HOST PORT [N]   the same over UDP (1 s timeout each)
    echo.py http-get HOST PORT [N]   N GETs of / on one connection; same
                                     output (bytes: requests and answers,
                                     head and body)
    echo.py publish HOST PORT TEXT   sends TEXT as one line to a collector,
                                     waits for its "ack"; same output

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
    # Room for bursts of connects (a kube lab's health probes of many
    # proxies at once).
    s.listen(4096)

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


def serve_udp(host, port):
    fam = socket.AF_INET6 if ":" in host else socket.AF_INET
    s = socket.socket(fam, socket.SOCK_DGRAM)
    s.bind((host, port))
    while True:
        b, peer = s.recvfrom(65536)
        s.sendto(b, peer)


def serve_http(host, port):
    import http.server

    class Handler(http.server.BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"
        # Headers and body go out as two writes: without this, Nagle and
        # the client's delayed ACK add 40 ms to every request.
        disable_nagle_algorithm = True

        def do_GET(self):
            body = b"device01-01: temperature=21.5C status=ok\n"
            self.send_response(200)
            self.send_header("Content-Type", "text/plain")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args):
            pass

    class Server(http.server.ThreadingHTTPServer):
        address_family = socket.AF_INET6 if ":" in host else socket.AF_INET

    Server((host, port), Handler).serve_forever()


def serve_collect(host, port):
    fam = socket.AF_INET6 if ":" in host else socket.AF_INET
    s = socket.socket(fam, socket.SOCK_STREAM)
    s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    s.bind((host, port))
    s.listen(16)

    def handle(c, peer):
        with c, c.makefile("rb") as lines:
            for line in lines:
                print("from %s:%d: %s" % (peer[0], peer[1], line.decode(errors="replace").rstrip("\n")), flush=True)
                c.sendall(b"ack\n")

    while True:
        c, peer = s.accept()
        threading.Thread(target=handle, args=(c, peer), daemon=True).start()


def publish(host, port, text):
    fam = socket.AF_INET6 if ":" in host else socket.AF_INET
    c = socket.socket(fam, socket.SOCK_STREAM)
    c.settimeout(3)
    c.connect((host, port))
    msg = text.encode() + b"\n"
    t = time.perf_counter()
    c.sendall(msg)
    got = b""
    while not got.endswith(b"\n"):
        chunk = c.recv(64)
        if not chunk:
            raise SystemExit("connection closed before the ack")
        got += chunk
    rtt = time.perf_counter() - t
    c.close()
    if got != b"ack\n":
        raise SystemExit("no ack: %r" % got)
    print("ok %d %d" % (len(msg) + len(got), rtt * 1e6))


def udp_ping(host, port, n):
    fam = socket.AF_INET6 if ":" in host else socket.AF_INET
    c = socket.socket(fam, socket.SOCK_DGRAM)
    c.settimeout(1)
    rtts, total = [], 0
    for i in range(n):
        msg = b"udp-%06d-" % i + b"x" * 54
        t = time.perf_counter()
        c.sendto(msg, (host, port))
        got, _ = c.recvfrom(2048)
        rtts.append(time.perf_counter() - t)
        if got != msg:
            raise SystemExit("udp echo mismatch")
        total += len(got) * 2
    print("ok %d %d" % (total, statistics.median(rtts) * 1e6))


def http_get(host, port, n):
    fam = socket.AF_INET6 if ":" in host else socket.AF_INET
    req = b"GET / HTTP/1.1\r\nHost: device01-01\r\n\r\n"
    rtts, total, c, buf = [], 0, None, b""
    for _ in range(n):
        if c is None:
            # A new connection when the server closed the last one (an
            # HTTP/1.0 server, or Connection: close).
            c = socket.socket(fam, socket.SOCK_STREAM)
            c.settimeout(3)
            c.connect((host, port))
            c.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            buf = b""
        t = time.perf_counter()
        c.sendall(req)
        while b"\r\n\r\n" not in buf:
            chunk = c.recv(65536)
            if not chunk:
                raise SystemExit("connection closed before the answer")
            buf += chunk
        head, _, buf = buf.partition(b"\r\n\r\n")
        lines = head.split(b"\r\n")
        fields = {}
        for line in lines[1:]:
            k, _, v = line.partition(b":")
            fields[k.strip().lower()] = v.strip().lower()
        length = int(fields.get(b"content-length", b"0"))
        while len(buf) < length:
            chunk = c.recv(65536)
            if not chunk:
                raise SystemExit("connection closed in the body")
            buf += chunk
        body, buf = buf[:length], buf[length:]
        rtts.append(time.perf_counter() - t)
        status = lines[0].split()
        if len(status) < 2 or status[1] != b"200" or b"device01-01" not in body:
            raise SystemExit("bad HTTP answer %r" % lines[0])
        total += len(req) + len(head) + 4 + len(body)
        if lines[0].startswith(b"HTTP/1.0") or fields.get(b"connection") == b"close":
            c.close()
            c = None
    if c is not None:
        c.close()
    print("ok %d %d" % (total, statistics.median(rtts) * 1e6))


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
    cmds = {"serve": serve, "serve-udp": serve_udp, "serve-http": serve_http, "serve-collect": serve_collect}
    clients = {"ping": ping, "udp-ping": udp_ping, "http-get": http_get}
    if len(sys.argv) >= 4 and sys.argv[1] in cmds:
        cmds[sys.argv[1]](sys.argv[2], int(sys.argv[3]))
    elif len(sys.argv) == 5 and sys.argv[1] == "publish":
        publish(sys.argv[2], int(sys.argv[3]), sys.argv[4])
    elif len(sys.argv) >= 4 and sys.argv[1] in clients:
        clients[sys.argv[1]](sys.argv[2], int(sys.argv[3]), int(sys.argv[4]) if len(sys.argv) > 4 else 100)
    else:
        sys.exit(__doc__)
