#!/usr/bin/env python3
"""Idle keep-alive connections for bench.py's `idle` section (stdlib only).

Usage: python3 bench/idle_conns.py PORT N [IN_FLIGHT]

Opens N TCP connections to 127.0.0.1:PORT (at most IN_FLIGHT, default 256, connecting or
waiting for their response at a time, so the server's accept backlog never overflows), sends one
`GET /` on each, reads the whole response (Content-Length) and keeps the connection open, idle.

Talks to the harness over stdin/stdout, one line each:
  -> `ready OPEN FAILED SECONDS`  once every connection has its response (or failed; at most 60 s)
  <- `check`                      -> `open N`: how many are still open (not closed by the server)
  <- end of stdin                 -> exits, resetting every connection (SO_LINGER 0: no TIME_WAIT)
"""
import errno
import resource
import selectors
import socket
import struct
import sys
import time

LINGER_0 = struct.pack("ii", 1, 0)
DEADLINE_S = 60


def raise_nofile(need):
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < need:
        resource.setrlimit(resource.RLIMIT_NOFILE, (min(hard, max(need, soft)), hard))


def response_done(buf):
    head, sep, body = buf.partition(b"\r\n\r\n")
    if not sep:
        return False
    for line in head.split(b"\r\n")[1:]:
        k, _, v = line.partition(b":")
        if k.strip().lower() == b"content-length":
            return len(body) >= int(v)
    return True  # no length: the head is enough for a hello-world server


def main():
    port, n = int(sys.argv[1]), int(sys.argv[2])
    in_flight = int(sys.argv[3]) if len(sys.argv) > 3 else 256
    raise_nofile(n + 64)
    req = f"GET / HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\n\r\n".encode()
    sel = selectors.DefaultSelector()
    idle, failed, started, pending = [], 0, 0, 0
    bufs = {}
    t0 = time.monotonic()

    def fail(s):
        nonlocal failed, pending
        failed += 1
        pending -= 1
        sel.unregister(s)
        s.close()

    while (started < n or pending) and time.monotonic() - t0 < DEADLINE_S:
        while started < n and pending < in_flight:
            started += 1
            try:
                s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            except OSError:  # out of file descriptors
                failed += n - started + 1
                started = n
                break
            s.setblocking(False)
            s.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, LINGER_0)
            err = s.connect_ex(("127.0.0.1", port))
            if err not in (0, errno.EINPROGRESS):
                failed += 1
                s.close()
                continue
            pending += 1
            sel.register(s, selectors.EVENT_WRITE, "connect")
        for key, _ in sel.select(timeout=0.5):
            s = key.fileobj
            if key.data == "connect":
                if s.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR):
                    fail(s)
                    continue
                try:
                    s.send(req)
                except OSError:
                    fail(s)
                    continue
                bufs[s] = b""
                sel.modify(s, selectors.EVENT_READ, "read")
            else:
                try:
                    data = s.recv(65536)
                except BlockingIOError:
                    continue
                except OSError:
                    data = b""
                if not data:
                    bufs.pop(s, None)
                    fail(s)
                    continue
                bufs[s] += data
                if response_done(bufs[s]):
                    del bufs[s]
                    sel.unregister(s)
                    pending -= 1
                    idle.append(s)
    for key in list(sel.get_map().values()):  # timed out
        failed += 1
        key.fileobj.close()
    print(f"ready {len(idle)} {failed} {time.monotonic() - t0:.2f}", flush=True)

    for line in sys.stdin:
        if line.strip() == "check":
            still = 0
            for s in idle:
                try:
                    still += s.recv(1, socket.MSG_PEEK) != b""
                except BlockingIOError:
                    still += 1
                except OSError:
                    pass
            print(f"open {still}", flush=True)
    for s in idle:
        s.close()


if __name__ == "__main__":
    main()
