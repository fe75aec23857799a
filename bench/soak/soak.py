#!/usr/bin/env python3
"""Soak test of a nodus cluster run as a long-lived service: what only time shows. A tool, not a test
(no cargo test runs it). Stdlib only (python3 >= 3.8), 127.0.0.1 only.

Usage:
  cargo build --release -p nodus-cli
  python3 bench/soak/soak.py [--target serve|node|both] [--load SECS] [--nodus PATH] [--out DIR] [--seed N]
                             [--reload-every SECS] [--kill-every SECS]
  (--reload-every 1 --kill-every 0: a churn of reloads, to see what each one leaves behind in the primary;
  nodus serve's restart budget, 5 within 60 s, allows a kill every 15 s at most)

Targets (2 workers each, one after the other with --target both):
  serve  nodus serve DIR --workers 2 --access-log (a directory of a 13-byte file and a 1 MiB one)
  node   nodus run -w 2 --node -- node bench/cluster/app.js PORT (stock Node http.createServer workers)

Timeline per target (at most about 11 minutes with the default --load 480):
  start; idle 5 s: the cold baseline; a warm-up (a few hundred requests of every kind); idle 10 s: the warm
  baseline; then --load seconds of modest load (a few hundred requests/s: keep-alive clients, one request per
  new connection, slow readers, idle connections, a burst of new connections every 45 s) during which the
  primary gets SIGHUP every 20 s (a rolling reload) and a random worker gets kill -9 every 30 s (offset by
  5 s); then every client connection is closed, 10 s idle: the end state; SIGTERM; the exit code; every pid
  ever seen checked gone.

Measures (a sample every 10 s, stored in OUT/TARGET/samples.jsonl):
  per process (primary, orphan guard, workers, anything below them): open fds by kind, TCP sockets by state,
  VmRSS, Pss (smaps_rollup), threads, state (zombies), parent (orphans: any pid seen that outlives the stop)
  /_nodus/stats and /_nodus/metrics: restarts, reloads, generation, workers up, connections handed per slot,
  a worker's open connections, requests in flight, live tasks, run queue, pool queue, the exposition's
  series count (a series per dead pid left behind would grow it without bound)
  the client: requests per outcome; every failure with its time, connection (client port, reused or not)
  and error. Failures are attributed: a kill -9 freezes the worker (SIGSTOP) for the moment it takes to read
  the connections it holds (/proc/PID/fd against /proc/net/tcp), then kills it, so a failure on one of those
  connections is the kill's (in flight at the kill, or a request sent afterwards on a connection the dead
  worker held: a stale keep-alive connection, which a client retries); anything else is unexplained.
  The logs: the primary's stderr (workers' lines come through it) grouped by template (numbers masked),
  first half of the load against the second, so a line repeating without bound stands out; the access log
  (serve) counted against what the client was answered.

Results: OUT/TARGET/{summary.json, samples.jsonl, failures.jsonl, events.jsonl (nodus --events),
stderr.log, stats-*.json, metrics-*.txt} and a plain-text summary on stdout. OUT defaults to
bench/results/soak-STAMP. Every process started is stopped by PID at the end and on errors or Ctrl-C.
"""
import argparse
import collections
import datetime as _dt
import json
import os
import random
import re
import signal
import socket
import subprocess
import sys
import threading
import time
import traceback
import urllib.request

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))
APP_JS = os.path.join(REPO, "bench", "cluster", "app.js")
HOST = "127.0.0.1"

RELOAD_EVERY = 20.0
KILL_EVERY, KILL_OFFSET = 30.0, 5.0
BURST_EVERY, BURST_CONNS = 45.0, 150
SAMPLE_EVERY = 10.0
IDLE_END = 10.0
KEEPALIVE_CLIENTS, KEEPALIVE_GAP = 6, 0.025   # ~40 req/s each
NEWCONN_CLIENTS, NEWCONN_GAP = 2, 0.04        # ~25 req/s each
SLOW_READERS = 2
IDLE_CONNS = 20
IO_TIMEOUT = 10.0
BIG_SIZE = 1 << 20


def log(*a):
    print(time.strftime("%H:%M:%S"), *a, file=sys.stderr, flush=True)


def now():
    return time.monotonic()


# ---------------------------------------------------------------- /proc

def read(path, mode="r"):
    try:
        with open(path, mode) as f:
            return f.read()
    except OSError:
        return None


def proc_field(pid, name, file="status"):
    text = read(f"/proc/{pid}/{file}") or ""
    for line in text.splitlines():
        if line.startswith(name + ":"):
            return int(line.split()[1])
    return None


def proc_stat(pid):
    """(state, ppid, starttime) of PID, or None once it is gone."""
    text = read(f"/proc/{pid}/stat")
    if not text:
        return None
    f = text.rsplit(") ", 1)[1].split()
    return f[0], int(f[1]), int(f[19])


def children(pid):
    out = []
    for tid in os.listdir(f"/proc/{pid}/task") if os.path.isdir(f"/proc/{pid}/task") else []:
        text = read(f"/proc/{pid}/task/{tid}/children") or ""
        out += [int(c) for c in text.split()]
    return sorted(set(out))


def cmdline(pid):
    raw = read(f"/proc/{pid}/cmdline", "rb") or b""
    return raw.replace(b"\0", b" ").decode(errors="replace").strip()


def fds(pid):
    """{fd: link target} of PID."""
    out = {}
    try:
        names = os.listdir(f"/proc/{pid}/fd")
    except OSError:
        return out
    for n in names:
        try:
            out[int(n)] = os.readlink(f"/proc/{pid}/fd/{n}")
        except OSError:
            pass
    return out


def fd_kind(target):
    if target.startswith("socket:"):
        return "socket"
    if target.startswith("pipe:"):
        return "pipe"
    if target.startswith("anon_inode:"):
        return target[len("anon_inode:"):].strip("[]")
    return "file"


TCP_STATES = {1: "ESTABLISHED", 2: "SYN_SENT", 3: "SYN_RECV", 4: "FIN_WAIT1", 5: "FIN_WAIT2", 6: "TIME_WAIT",
              7: "CLOSE", 8: "CLOSE_WAIT", 9: "LAST_ACK", 10: "LISTEN", 11: "CLOSING"}


def tcp_table():
    """{inode: (local_port, remote_port, state)} of every TCP socket (IPv4 and IPv6)."""
    out = {}
    for name in ("tcp", "tcp6"):
        text = read(f"/proc/net/{name}") or ""
        for line in text.splitlines()[1:]:
            f = line.split()
            if len(f) < 10:
                continue
            lport = int(f[1].rsplit(":", 1)[1], 16)
            rport = int(f[2].rsplit(":", 1)[1], 16)
            out[int(f[9])] = (lport, rport, TCP_STATES.get(int(f[3], 16), f[3]))
    return out


def socket_inodes(fdmap):
    return [int(t[8:-1]) for t in fdmap.values() if t.startswith("socket:[")]


# ---------------------------------------------------------------- HTTP client

class Failure(Exception):
    def __init__(self, kind, detail="", got=0):
        super().__init__(f"{kind}: {detail}")
        self.kind, self.detail, self.got = kind, detail, got


class Conn:
    """One client connection: raw socket, plain HTTP/1.1 parsing (Content-Length, chunked, EOF)."""

    def __init__(self, port, rcvbuf=None):
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        if rcvbuf:
            self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, rcvbuf)
        self.sock.settimeout(IO_TIMEOUT)
        try:
            self.sock.connect((HOST, port))
        except ConnectionRefusedError as e:
            self.sock.close()
            raise Failure("refused", str(e))
        except socket.timeout as e:
            self.sock.close()
            raise Failure("connect-timeout", str(e))
        except OSError as e:
            self.sock.close()
            raise Failure("connect-error", str(e))
        self.lport = self.sock.getsockname()[1]
        self.opened = now()
        self.answered = 0
        self.buf = b""

    def close(self):
        try:
            self.sock.close()
        except OSError:
            pass

    def send(self, data):
        try:
            self.sock.sendall(data)
        except (BrokenPipeError, ConnectionResetError) as e:
            raise Failure("reset-on-send", str(e))
        except socket.timeout as e:
            raise Failure("timeout", "send: " + str(e))

    def _more(self, got, slow=None):
        try:
            if slow:
                time.sleep(slow[1])
            data = self.sock.recv(slow[0] if slow else 65536)
        except ConnectionResetError as e:
            raise Failure("reset", str(e), got)
        except socket.timeout as e:
            raise Failure("timeout", str(e), got)
        if not data:
            raise Failure("eof-before-response" if got == 0 else "eof-mid-response", "", got)
        self.buf += data
        return len(data)

    def read_response(self, slow=None):
        """(status, body bytes, server keeps the connection)."""
        got = 0
        while b"\r\n\r\n" not in self.buf:
            got += self._more(got)
        head, self.buf = self.buf.split(b"\r\n\r\n", 1)
        lines = head.decode("latin-1").split("\r\n")
        try:
            status = int(lines[0].split()[1])
        except (IndexError, ValueError):
            raise Failure("bad-status-line", lines[0][:80], got)
        hdr = {}
        for line in lines[1:]:
            k, _, v = line.partition(":")
            hdr[k.strip().lower()] = v.strip()
        keep = hdr.get("connection", "").lower() != "close"
        if "content-length" in hdr:
            n = int(hdr["content-length"])
            while len(self.buf) < n:
                got += self._more(got + len(self.buf), slow)
            body, self.buf = self.buf[:n], self.buf[n:]
        elif hdr.get("transfer-encoding", "").lower() == "chunked":
            body = b""
            while True:
                while b"\r\n" not in self.buf:
                    got += self._more(got)
                size_line, self.buf = self.buf.split(b"\r\n", 1)
                size = int(size_line.split(b";")[0], 16)
                while len(self.buf) < size + 2:
                    got += self._more(got, slow)
                body += self.buf[:size]
                self.buf = self.buf[size + 2:]
                if size == 0:
                    break
        else:
            while True:
                try:
                    got += self._more(got, slow)
                except Failure as f:
                    if f.kind.startswith("eof"):
                        break
                    raise
            body, self.buf, keep = self.buf, b"", False
        self.answered += 1
        return status, len(body), keep


def request_bytes(path, port, close=False):
    extra = "Connection: close\r\n" if close else ""
    return f"GET {path} HTTP/1.1\r\nHost: {HOST}:{port}\r\n{extra}\r\n".encode()


# ---------------------------------------------------------------- the client's record

class Record:
    def __init__(self):
        self.lock = threading.Lock()
        self.ok = collections.Counter()        # by client kind
        self.fail = collections.Counter()      # by (client kind, failure kind)
        self.failures = []                     # dicts
        self.conns_opened = 0                  # connections to the public port
        self.in_flight = {}                    # client port -> request start (monotonic)
        self.idle_closed_by_server = collections.Counter()  # idle conn kind -> count
        self.idle_lifetimes = collections.defaultdict(list)

    def opened(self):
        with self.lock:
            self.conns_opened += 1

    def start(self, lport):
        with self.lock:
            self.in_flight[lport] = now()

    def done(self, kind, lport, n=1):
        with self.lock:
            self.in_flight.pop(lport, None)
            self.ok[kind] += n

    def failed(self, kind, f, t0, conn=None, lport=None):
        t1 = now()
        with self.lock:
            if conn is not None:
                self.in_flight.pop(conn.lport, None)
            self.fail[(kind, f.kind)] += 1
            self.failures.append({
                "t0": t0, "t1": t1, "client": kind, "kind": f.kind, "detail": f.detail[:120], "got": f.got,
                "lport": conn.lport if conn else lport, "opened": conn.opened if conn else None,
                "reused": bool(conn and conn.answered > 0)})

    def in_flight_on(self, ports):
        with self.lock:
            return sum(1 for p in ports if p in self.in_flight)


class Load:
    """The client pool: threads that run until stop is set."""

    def __init__(self, port, kind, rec, seed):
        self.port, self.kind, self.rec = port, kind, rec
        self.stop = threading.Event()
        self.threads = []
        self.rng = random.Random(seed)
        self.open_conns = set()
        self.lock = threading.Lock()

    def _track(self, conn, add):
        with self.lock:
            (self.open_conns.add if add else self.open_conns.discard)(conn)

    def _connect(self, rcvbuf=None):
        conn = Conn(self.port, rcvbuf)
        self.rec.opened()
        self._track(conn, True)
        return conn

    def _drop(self, conn):
        if conn:
            self._track(conn, False)
            conn.close()

    def start(self):
        for i in range(KEEPALIVE_CLIENTS):
            self._spawn(self.keepalive, i)
        for i in range(NEWCONN_CLIENTS):
            self._spawn(self.newconn, i)
        for i in range(SLOW_READERS):
            self._spawn(self.slow_reader, i)
        self._spawn(self.idle, 0)

    def _spawn(self, fn, i):
        t = threading.Thread(target=self._guarded, args=(fn, i), daemon=True, name=f"{fn.__name__}-{i}")
        t.start()
        self.threads.append(t)

    def _guarded(self, fn, i):
        try:
            fn(random.Random(self.rng.random() + i))
        except Exception:
            log(f"client thread {fn.__name__} died:\n{traceback.format_exc()}")

    def join(self):
        self.stop.set()
        for t in self.threads:
            t.join(IO_TIMEOUT + 5)
        with self.lock:
            left = list(self.open_conns)
        for c in left:
            c.close()
        self.threads = []

    def _one(self, kind, conn, path, close=False, slow=None, pipeline=1):
        """One request (or `pipeline` of them) on conn; returns whether the connection stays usable."""
        t0 = now()
        self.rec.start(conn.lport)
        try:
            conn.send(request_bytes(path, self.port, close) * pipeline)
            keep = True
            for _ in range(pipeline):
                status, _n, keep = conn.read_response(slow)
                if status >= 500:
                    raise Failure("5xx", str(status))
                if status != 200:
                    raise Failure("status", str(status))
            self.rec.done(kind, conn.lport, pipeline)
            return keep and not close
        except Failure as f:
            self.rec.failed(kind, f, t0, conn)
            return False

    def keepalive(self, rng):
        conn, left = None, 0
        while not self.stop.is_set():
            if conn is None:
                try:
                    conn = self._connect()
                except Failure as f:
                    self.rec.failed("keepalive", f, now())
                    self.stop.wait(0.2)
                    continue
                left = rng.randint(50, 500)
            keep = self._one("keepalive", conn, "/hello.txt" if self.kind == "serve" else "/")
            left -= 1
            if not keep or left <= 0:
                self._drop(conn)
                conn = None
            self.stop.wait(KEEPALIVE_GAP * rng.uniform(0.5, 1.5))
        self._drop(conn)

    def newconn(self, rng):
        while not self.stop.is_set():
            try:
                conn = self._connect()
            except Failure as f:
                self.rec.failed("newconn", f, now())
                self.stop.wait(0.2)
                continue
            self._one("newconn", conn, "/hello.txt" if self.kind == "serve" else "/", close=True)
            self._drop(conn)
            self.stop.wait(NEWCONN_GAP * rng.uniform(0.5, 1.5))

    def slow_reader(self, rng):
        """serve: a 1 MiB file read 16 KiB every 50 ms (~3 s); node: 200 pipelined requests read 512 bytes every
        20 ms (~1 s). A small receive buffer, so the server sees a slow reader."""
        while not self.stop.is_set():
            try:
                conn = self._connect(rcvbuf=16384)
            except Failure as f:
                self.rec.failed("slow", f, now())
                self.stop.wait(0.5)
                continue
            if self.kind == "serve":
                self._one("slow", conn, "/big.bin", slow=(16384, 0.05))
            else:
                self._one("slow", conn, "/", slow=(512, 0.02), pipeline=200)
            self._drop(conn)
            self.stop.wait(rng.uniform(0.5, 2.0))

    def idle(self, rng):
        """IDLE_CONNS connections: half never send anything, half send one request then sit idle. One the
        server closes (its timeouts, a reload's drain, a kill) is counted and replaced."""
        import selectors
        sel = selectors.DefaultSelector()

        def open_one(kind):
            try:
                c = self._connect()
            except Failure as f:
                self.rec.failed("idle", f, now())
                return
            if kind == "after-request" and not self._one("idle", c, "/hello.txt" if self.kind == "serve" else "/"):
                self._drop(c)
                return
            c.sock.setblocking(False)
            sel.register(c.sock, selectors.EVENT_READ, (c, kind))

        for i in range(IDLE_CONNS):
            open_one("no-request" if i % 2 else "after-request")
        while not self.stop.is_set():
            for key, _ in sel.select(0.5):
                c, kind = key.data
                try:
                    data = c.sock.recv(4096)
                except (BlockingIOError, InterruptedError):
                    continue
                except OSError:
                    data = b""
                sel.unregister(c.sock)
                with self.rec.lock:
                    self.rec.idle_closed_by_server[(kind, "eof" if not data else "data")] += 1
                    self.rec.idle_lifetimes[kind].append(now() - c.opened)
                self._drop(c)
                if not self.stop.is_set():
                    open_one(kind)
        for key in list(sel.get_map().values()):
            self._drop(key.data[0])
        sel.close()

    def burst(self, n=BURST_CONNS):
        """n connections opened at once, one request on each, all sent before any is read."""
        t0 = now()
        conns = []
        for _ in range(n):
            try:
                conns.append(self._connect())
            except Failure as f:
                self.rec.failed("burst", f, t0)
        path = "/hello.txt" if self.kind == "serve" else "/"
        live = []
        for c in conns:
            self.rec.start(c.lport)
            try:
                c.send(request_bytes(path, self.port, close=True))
                live.append(c)
            except Failure as f:
                self.rec.failed("burst", f, t0, c)
                self._drop(c)
        for c in live:
            try:
                status, _n, _keep = c.read_response()
                if status >= 500:
                    raise Failure("5xx", str(status))
                self.rec.done("burst", c.lport)
            except Failure as f:
                self.rec.failed("burst", f, t0, c)
            self._drop(c)
        return now() - t0


# ---------------------------------------------------------------- the service under test

class Target:
    def __init__(self, name, nodus, outdir, port, admin):
        self.name, self.nodus, self.outdir, self.port, self.admin = name, nodus, outdir, port, admin
        self.proc = None
        self.seen = {}          # pid -> (starttime, role, first seen)
        self.events_path = os.path.join(outdir, "events.jsonl")
        self.stderr_path = os.path.join(outdir, "stderr.log")

    def argv(self):
        if self.name == "serve":
            www = os.path.join(self.outdir, "www")
            os.makedirs(www, exist_ok=True)
            with open(os.path.join(www, "hello.txt"), "w") as f:
                f.write("Hello, World!")
            with open(os.path.join(www, "big.bin"), "wb") as f:
                f.write(os.urandom(BIG_SIZE))
            return [self.nodus, "serve", www, "--workers", "2", "--listen", f"{HOST}:{self.port}",
                    "--admin", f"{HOST}:{self.admin}", "--events", self.events_path, "--access-log"]
        return [self.nodus, "run", "-w", "2", "--node", "--admin", f"{HOST}:{self.admin}",
                "--events", self.events_path, "--", "node", APP_JS, str(self.port)]

    def start(self):
        argv = self.argv()
        log(f"[{self.name}] starting: {' '.join(argv)}")
        self.err = open(self.stderr_path, "wb")
        self.proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=self.err, stderr=self.err,
                                     start_new_session=True, cwd=self.outdir)
        self.note(self.proc.pid, "primary")
        deadline = now() + 30
        while now() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"{self.name}: exited {self.proc.returncode} at start (see {self.stderr_path})")
            st = self.stats()
            if st and st.get("workers_up") == 2 and self.public_ok():
                return
            time.sleep(0.2)
        raise RuntimeError(f"{self.name}: not ready within 30 s")

    def public_ok(self):
        try:
            c = Conn(self.port)
            c.send(request_bytes("/hello.txt" if self.name == "serve" else "/", self.port, close=True))
            ok = c.read_response()[0] == 200
            c.close()
            return ok
        except Failure:
            return False

    def note(self, pid, role):
        st = proc_stat(pid)
        if st and pid not in self.seen:
            self.seen[pid] = (st[2], role, now())

    def fetch(self, path, timeout=5):
        try:
            with urllib.request.urlopen(f"http://{HOST}:{self.admin}{path}", timeout=timeout) as r:
                return r.read().decode()
        except Exception:
            return None

    def stats(self):
        text = self.fetch("/_nodus/stats")
        try:
            return json.loads(text) if text else None
        except ValueError:
            return None

    def tree(self):
        """[(pid, role, ppid)] of the primary and everything below it."""
        pp = self.proc.pid
        out = [(pp, "primary", os.getppid())]
        todo = [(c, pp) for c in children(pp)]
        while todo:
            pid, parent = todo.pop()
            cl = cmdline(pid)
            if parent == pp:
                role = "guard" if cl.startswith("nodus-guard") else "worker"
            else:
                role = "descendant"
            out.append((pid, role, parent))
            self.note(pid, role)
            todo += [(c, pid) for c in children(pid)]
        return out

    def workers(self):
        return [pid for pid, role, _ in self.tree() if role == "worker"]

    def kill_worker(self, rng, rec):
        """SIGSTOP a random worker, read the client ports of the connections it holds, SIGKILL it."""
        ws = self.workers()
        if not ws:
            return None
        pid = rng.choice(ws)
        t = now()
        try:
            os.kill(pid, signal.SIGSTOP)
        except ProcessLookupError:
            return None
        inodes = socket_inodes(fds(pid))
        table = tcp_table()
        ports = {table[i][1] for i in inodes if i in table and table[i][0] == self.port and table[i][2] != "LISTEN"}
        inflight = rec.in_flight_on(ports)
        os.kill(pid, signal.SIGKILL)
        return {"t": t, "pid": pid, "ports": sorted(ports), "in_flight": inflight}

    def sighup(self):
        os.kill(self.proc.pid, signal.SIGHUP)

    def stop(self, timeout=40):
        """SIGTERM, the exit code, and every pid ever seen checked gone; what is left is SIGKILLed by PID."""
        if self.proc is None:
            return None, []
        code = self.proc.poll()
        if code is None:
            try:
                self.proc.send_signal(signal.SIGTERM)
                code = self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                code = "timeout"
        time.sleep(0.5)
        left = []
        for pid, (start, role, _) in self.seen.items():
            st = proc_stat(pid)
            if st and st[2] == start:
                left.append({"pid": pid, "role": role, "state": st[0], "ppid": st[1], "cmd": cmdline(pid)[:100]})
        self.kill_all()
        self.err.close()
        return code, left

    def kill_all(self):
        for pid, (start, _role, _) in list(self.seen.items()):
            st = proc_stat(pid)
            if st and st[2] == start and st[0] != "Z":
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
        if self.proc and self.proc.poll() is None:
            try:
                self.proc.wait(5)
            except subprocess.TimeoutExpired:
                pass


# ---------------------------------------------------------------- samples

def metric_series(text):
    """[(name, labels dict, value)] of a text exposition (classic format)."""
    out = []
    for line in (text or "").splitlines():
        if not line or line.startswith("#"):
            continue
        m = re.match(r'([a-zA-Z_:][a-zA-Z0-9_:]*)(\{(.*)\})?\s+(\S+)', line)
        if not m:
            continue
        labels = dict(re.findall(r'(\w+)="((?:[^"\\]|\\.)*)"', m.group(3) or ""))
        try:
            out.append((m.group(1), labels, float(m.group(4))))
        except ValueError:
            pass
    return out


def metric_sum(series, name, **want):
    return sum(v for n, lab, v in series if n == name and all(lab.get(k) == w for k, w in want.items()))


def sample(target, rec, label, t0, save=False):
    table = tcp_table()
    procs = []
    for pid, role, ppid in target.tree():
        st = proc_stat(pid)
        fdm = fds(pid)
        kinds = collections.Counter(fd_kind(t) for t in fdm.values())
        tcp = collections.Counter(table[i][2] for i in socket_inodes(fdm) if i in table)
        procs.append({"pid": pid, "role": role, "ppid": ppid, "state": st[0] if st else "gone",
                      "fds": len(fdm), "fd_kinds": dict(kinds), "tcp": dict(tcp),
                      "rss_kb": proc_field(pid, "VmRSS"), "pss_kb": proc_field(pid, "Pss", "smaps_rollup"),
                      "threads": proc_field(pid, "Threads")})
    st_text = target.fetch("/_nodus/stats")
    m_text = target.fetch("/_nodus/metrics")
    if save:
        for name, text in (("stats", st_text), ("metrics", m_text)):
            with open(os.path.join(target.outdir, f"{name}-{label}.{'json' if name == 'stats' else 'txt'}"), "w") as f:
                f.write(text or "")
    st = json.loads(st_text) if st_text else {}
    series = metric_series(m_text)
    workers = []
    for w in st.get("workers", []):
        snap = w.get("snapshot") or {}
        http = snap.get("http") or {}
        workers.append({
            "worker": w.get("worker"), "pid": w.get("pid"), "generation": w.get("generation"),
            "state": w.get("state"), "restarts": w.get("restarts"), "handed": w.get("connections_handed"),
            "taken_back": w.get("connections_taken_back"), "answering": w.get("answering"),
            "conns_open": http.get("connections_open"), "in_flight": http.get("requests_in_flight"),
            "conns_total": http.get("connections_total"),
            "tasks_alive": (snap.get("tasks") or {}).get("alive"),
            "run_queue": (snap.get("run_queue") or {}).get("current"),
            "pool_queue": sum(p.get("queue_depth", 0) for p in snap.get("pools", [])),
            "stalls": len(snap.get("stalls", [])) if snap else None})
    with rec.lock:
        client = {"ok": sum(rec.ok.values()), "fail": sum(rec.fail.values()), "conns_opened": rec.conns_opened,
                  "in_flight": len(rec.in_flight)}
    return {
        "label": label, "t": round(now() - t0, 1), "procs": procs, "client": client,
        "cluster": {k: st.get(k) for k in ("workers_up", "restarts", "budget_left", "generation", "reloading",
                                           "reloads", "returned_rejected", "orphans_adopted", "orphans_reaped",
                                           "last_exit")},
        "workers": workers,
        "metrics": {"series": len(series),
                    "restarts_total": metric_sum(series, "nodus_cluster_restarts_total"),
                    "reloads_done": metric_sum(series, "nodus_cluster_reloads_total", result="done"),
                    "reloads_failed": metric_sum(series, "nodus_cluster_reloads_total", result="failed"),
                    "generation": metric_sum(series, "nodus_cluster_generation"),
                    "handed_total": metric_sum(series, "nodus_cluster_connections_handed_total"),
                    "worker_restarts_total": metric_sum(series, "nodus_cluster_worker_restarts_total"),
                    "pids": len({lab.get("pid") for n, lab, v in series if "pid" in lab})},
        "stats_bytes": len(st_text or ""), "metrics_bytes": len(m_text or ""),
    }


def brief(s):
    parts = []
    for p in s["procs"]:
        parts.append(f"{p['role'][0]}{p['pid']}:{p['fds']}fd/{(p['rss_kb'] or 0) // 1024}M/{p['state']}")
    w = ",".join(f"{x['worker']}g{x['generation']}:{x['conns_open']}c" for x in s["workers"])
    c = s["cluster"]
    return (f"t={s['t']:>6} {' '.join(parts)} | up={c.get('workers_up')} gen={c.get('generation')} "
            f"restarts={c.get('restarts')} reloads={c.get('reloads')} [{w}] | client ok={s['client']['ok']} "
            f"fail={s['client']['fail']}")


# ---------------------------------------------------------------- logs

TS = re.compile(r"\d{4}-\d\d-\d\dT[\d:.]+Z\s*")
WORKER = re.compile(r"^\[worker \d+ \d+\]\s*")
NUM = re.compile(r"\d+(\.\d+)?")


def log_templates(path, start=0, end=None):
    """(Counter of templates (numbers masked) but the access log's, Counter of the access log's (path,
    status), line count) over the bytes start..end of the stderr log."""
    raw = read(path, "rb") or b""
    lines = raw[start:end].decode(errors="replace").splitlines()
    access = collections.Counter()
    tmpl = collections.Counter()
    for line in lines:
        body = TS.sub("", WORKER.sub("[worker] ", line))
        if "nodus::access:" in body:
            m = re.search(r'"(\S+) (\S+) [^"]*" (\d{3}) (\d+)', body)
            access[(m.group(2), m.group(3)) if m else ("?", "?")] += 1
            continue
        tmpl[NUM.sub("#", body)[:160]] += 1
    return tmpl, access, len(lines)


# ---------------------------------------------------------------- one target

def run_target(name, args, outroot):
    outdir = os.path.join(outroot, name)
    os.makedirs(outdir, exist_ok=True)
    rng = random.Random(args.seed)
    port, admin = free_port(), free_port()
    target = Target(name, args.nodus, outdir, port, admin)
    rec = Record()
    events = []     # (t, kind, info)
    kills = []
    samples = []
    sample_file = open(os.path.join(outdir, "samples.jsonl"), "w")
    t0 = now()
    load = None
    log_at = {}     # the stderr log's size at the load's start and end

    def take(label, save=False):
        s = sample(target, rec, label, t0, save)
        samples.append(s)
        sample_file.write(json.dumps(s) + "\n")
        sample_file.flush()
        log(f"[{name}] {label:8} {brief(s)}")
        return s

    try:
        target.start()
        time.sleep(5)
        take("cold", save=True)
        # Warm-up: every kind of request once in a while, so lazy allocations are made before the baseline.
        load = Load(port, name, Record(), args.seed)
        load.start()
        time.sleep(5)
        load.burst(50)
        load.join()
        time.sleep(IDLE_END)
        take("baseline", save=True)

        load = Load(port, name, rec, args.seed)
        log_at["load-start"] = os.path.getsize(target.stderr_path)
        t_load = now()
        load.start()
        events.append((t_load, "load-start", {}))
        never = float("inf")
        next_reload = args.reload_every or never
        next_kill = KILL_OFFSET + args.reload_every if args.kill_every else never
        next_burst = BURST_EVERY / 4
        next_sample = SAMPLE_EVERY
        while True:
            el = now() - t_load
            if el >= args.load:
                break
            if el >= next_reload:
                target.sighup()
                events.append((now(), "reload", {}))
                next_reload += args.reload_every
            if el >= next_kill:
                k = target.kill_worker(rng, rec)
                if k:
                    kills.append(k)
                    events.append((k["t"], "kill", {"pid": k["pid"], "conns": len(k["ports"]),
                                                    "in_flight": k["in_flight"]}))
                    log(f"[{name}] kill -9 worker {k['pid']}: {len(k['ports'])} connections, "
                        f"{k['in_flight']} requests in flight")
                next_kill += args.kill_every
            if el >= next_burst:
                t = now()
                took = load.burst()
                events.append((t, "burst", {"seconds": round(took, 2)}))
                next_burst += BURST_EVERY
            if el >= next_sample:
                take(f"load{int(next_sample)}")
                next_sample += SAMPLE_EVERY
            time.sleep(0.05)
        load.join()
        t_end = now()
        events.append((t_end, "load-end", {}))
        log_at["load-end"] = os.path.getsize(target.stderr_path)
        time.sleep(IDLE_END)
        take("end", save=True)
    finally:
        if load:
            load.join()
        code, left = target.stop()
        sample_file.close()
    return summarize(name, target, rec, events, kills, samples, code, left, log_at, t0, outdir, args)


def free_port():
    s = socket.socket()
    s.bind((HOST, 0))
    p = s.getsockname()[1]
    s.close()
    return p


# ---------------------------------------------------------------- summary

def attribute(rec, kills, events, reload_every):
    """Each failure: the kill whose connections it was on (in flight at it, or a stale reuse after it), or
    the nearest reload before it, or none."""
    reloads = [t for t, k, _ in events if k == "reload"]
    out = collections.Counter()
    per_kill = [{"pid": k["pid"], "conns": len(k["ports"]), "in_flight": k["in_flight"],
                 "failed_in_flight": 0, "failed_stale": 0} for k in kills]
    unexplained = []
    for f in rec.failures:
        hit = None
        for i, k in enumerate(kills):
            if (f["lport"] in k["ports"] and f["opened"] is not None and f["opened"] <= k["t"] <= f["t1"]):
                hit = i
        if hit is not None:
            if f["t0"] <= kills[hit]["t"]:
                per_kill[hit]["failed_in_flight"] += 1
                out["kill: in flight"] += 1
            else:
                per_kill[hit]["failed_stale"] += 1
                out["kill: stale keep-alive reuse"] += 1
            continue
        before = [t for t in reloads if t <= f["t1"]]
        since = f["t1"] - before[-1] if before else None
        f["since_reload"] = round(since, 3) if since is not None else None
        where = f"reload +{int(since)} s" if since is not None and since < reload_every else "no event"
        out[f"{where}: {f['kind']}{' (reused conn)' if f['reused'] else ''}"] += 1
        unexplained.append(f)
    return out, per_kill, unexplained


def proc_rows(s, role):
    return [p for p in s["procs"] if p["role"] == role]


def summarize(name, target, rec, events, kills, samples, code, left, log_at, t0, outdir, args):
    by = {s["label"]: s for s in samples}
    a, b = log_at.get("load-start", 0), log_at.get("load-end")
    mid = (a + b) // 2 if b else None
    tmpl, access, _ = log_templates(target.stderr_path, a, b)
    first, _, _ = log_templates(target.stderr_path, a, mid)
    second, _, _ = log_templates(target.stderr_path, mid, b)
    whole, _, _ = log_templates(target.stderr_path)
    cold, base, end = by.get("cold"), by.get("baseline"), by.get("end")
    load = [s for s in samples if s["label"].startswith("load")]
    reloads = sum(1 for _, k, _ in events if k == "reload")
    nkills = len(kills)
    causes, per_kill, unexplained = attribute(rec, kills, events, args.reload_every or RELOAD_EVERY)

    def role_line(role):
        rows = []
        for lab, s in (("cold", cold), ("baseline", base), ("end", end)):
            if s:
                ps = proc_rows(s, role)
                rows.append((lab, [(p["pid"], p["fds"], p["rss_kb"], p["pss_kb"], p["threads"], p["fd_kinds"],
                                    p["tcp"]) for p in ps]))
        return rows

    primary_series = [(s["t"], proc_rows(s, "primary")[0]["fds"], proc_rows(s, "primary")[0]["rss_kb"],
                       proc_rows(s, "primary")[0]["pss_kb"]) for s in samples if proc_rows(s, "primary")]
    guard_series = [(s["t"], p["fds"], p["rss_kb"], p["pss_kb"]) for s in samples for p in proc_rows(s, "guard")]
    # Per generation: each worker's last sample under load (its most grown state before it was replaced).
    gens = {}
    for s in load:
        for w in s["workers"]:
            p = next((p for p in s["procs"] if p["pid"] == w["pid"]), None)
            if p:
                gens[(w["generation"], w["worker"], w["pid"])] = (p["fds"], p["rss_kb"], p["pss_kb"], w["conns_open"],
                                                                  w["tasks_alive"])
    # Node workers are not in the stats' snapshot list with generations when they do not answer; fall back
    # to the process tree for them too.
    worker_mem = collections.defaultdict(list)
    for s in load:
        for p in proc_rows(s, "worker"):
            worker_mem[p["pid"]].append((s["t"], p["fds"], p["rss_kb"], p["pss_kb"]))
    zombies = [(s["label"], p["pid"], p["role"]) for s in samples for p in s["procs"] if p["state"] == "Z"]
    descendants = [(s["label"], p["pid"]) for s in samples for p in s["procs"] if p["role"] == "descendant"]
    guards = [len(proc_rows(s, "guard")) for s in samples]
    evfile = [json.loads(x) for x in (read(target.events_path) or "").splitlines() if x.strip()]
    evcount = collections.Counter(e.get("event") for e in evfile)
    killed_exits = sum(1 for e in evfile if e.get("event") == "exit" and e.get("pid") in {k["pid"] for k in kills})
    final = end or samples[-1]
    summary = {
        "target": name, "port": target.port, "load_seconds": args.load, "reload_every": args.reload_every,
        "kill_every": args.kill_every, "exit_code": code, "left_after_stop": left,
        "client": {"ok": dict(rec.ok), "ok_total": sum(rec.ok.values()),
                   "failures": {f"{a}/{b}": n for (a, b), n in rec.fail.items()},
                   "failures_total": sum(rec.fail.values()), "conns_opened": rec.conns_opened,
                   "idle_closed_by_server": {f"{a}/{b}": n for (a, b), n in rec.idle_closed_by_server.items()},
                   "idle_lifetime_median": {k: sorted(v)[len(v) // 2] for k, v in rec.idle_lifetimes.items() if v}},
        "done": {"reloads_sent": reloads, "kills": nkills,
                 "bursts": sum(1 for _, k, _ in events if k == "burst")},
        "failure_causes": dict(causes), "per_kill": per_kill, "unexplained": unexplained[:50],
        "unexplained_since_reload_max": max((f["since_reload"] for f in unexplained
                                             if f["since_reload"] is not None), default=None),
        "cluster_end": final["cluster"], "metrics_end": final["metrics"],
        "metrics_series": {lab: by[lab]["metrics"]["series"] for lab in ("cold", "baseline", "end") if lab in by},
        "stats_bytes": {lab: by[lab]["stats_bytes"] for lab in ("cold", "baseline", "end") if lab in by},
        "events_file": dict(evcount), "killed_worker_exit_events": killed_exits,
        "primary": role_line("primary"), "guard": role_line("guard"), "workers_idle": role_line("worker"),
        "primary_series": primary_series, "guard_series": guard_series,
        "generations": {f"g{g} w{w} pid{p}": v for (g, w, p), v in sorted(gens.items())},
        "worker_mem": {str(k): v[-1] for k, v in worker_mem.items()},
        "zombies_seen": zombies, "descendants_seen": descendants, "guard_counts": sorted(set(guards)),
        "workers_idle_end": final["workers"], "workers_idle_baseline": base["workers"] if base else None,
        "log_templates": [(t, n, first[t], second[t]) for t, n in tmpl.most_common(40)],
        "log_lines": sum(tmpl.values()), "log_lines_whole_run": sum(whole.values()),
        "log_templates_outside_load": [(t, n) for t, n in (whole - tmpl).most_common(30)],
        "access_log": {f"{p} {s}": n for (p, s), n in access.items()},
        "handed_during_load": (final["metrics"]["handed_total"] - base["metrics"]["handed_total"]) if base else None,
    }
    with open(os.path.join(outdir, "driver_events.jsonl"), "w") as f:
        for t, kind, info in events:
            f.write(json.dumps({"t": round(t - t0, 3), "event": kind, **info}) + "\n")
    with open(os.path.join(outdir, "failures.jsonl"), "w") as f:
        for x in rec.failures:
            f.write(json.dumps(x) + "\n")
    with open(os.path.join(outdir, "summary.json"), "w") as f:
        json.dump(summary, f, indent=1, default=str)
    print_summary(summary)
    return summary


def print_summary(s):
    p = print
    p(f"\n===== {s['target']} =====")
    p(f"exit code {s['exit_code']}; left after the stop: {s['left_after_stop'] or 'none'}")
    d = s["done"]
    p(f"done: {d['reloads_sent']} SIGHUP, {d['kills']} kill -9, {d['bursts']} bursts")
    c = s["client"]
    p(f"client: {c['ok_total']} ok {c['ok']}, {c['failures_total']} failed {c['failures']}, "
      f"{c['conns_opened']} connections")
    p(f"failure causes: {s['failure_causes']}; the latest after a reload: {s['unexplained_since_reload_max']} s")
    for k in s["per_kill"]:
        p(f"  kill pid {k['pid']}: {k['conns']} conns, {k['in_flight']} in flight -> failed {k['failed_in_flight']} "
          f"in flight + {k['failed_stale']} stale reuse")
    for f in s["unexplained"][:10]:
        p(f"  unexplained: {f}")
    ce, me = s["cluster_end"], s["metrics_end"]
    p(f"stats at end: {ce}")
    p(f"metrics at end: {me}")
    p(f"metrics series cold/baseline/end: {s['metrics_series']}; stats bytes: {s['stats_bytes']}")
    p(f"events file: {s['events_file']}; exits of killed workers: {s['killed_worker_exit_events']}")
    for role in ("primary", "guard", "workers_idle"):
        for lab, rows in s[role]:
            for pid, nfd, rss, pss, th, kinds, tcp in rows:
                p(f"  {role:12} {lab:8} pid {pid}: {nfd} fds {kinds} tcp {tcp}, RSS {rss} kB, PSS {pss} kB, "
                  f"{th} threads")
    p(f"primary (t, fds, rss, pss): {s['primary_series']}")
    p(f"guard   (t, fds, rss, pss): {s['guard_series'][:1]} ... {s['guard_series'][-1:]}")
    p("generations (fds, rss kB, pss kB, conns open, tasks alive) at their last sample under load:")
    for k, v in s["generations"].items():
        p(f"  {k}: {v}")
    if not s["generations"]:
        for k, v in s["worker_mem"].items():
            p(f"  pid {k}: (t, fds, rss, pss) {v}")
    p(f"zombies seen: {s['zombies_seen']}; descendants: {s['descendants_seen']}; guards per sample: "
      f"{s['guard_counts']}")
    p(f"workers idle at baseline: {s['workers_idle_baseline']}")
    p(f"workers idle at end:      {s['workers_idle_end']}")
    p(f"access log during the load: {s['access_log']} (client ok {c['ok_total']})")
    p(f"connections handed to workers during the load (metrics): {s['handed_during_load']} "
      f"(client opened {c['conns_opened']})")
    p(f"log lines during the load (access log aside): {s['log_lines']}; templates (count, first half, second):")
    for t, n, a, b in s["log_templates"]:
        p(f"  {n:6} {a:5} {b:5}  {t}")
    p(f"log lines of the whole run (access log aside): {s['log_lines_whole_run']}; outside the load:")
    for t, n in s["log_templates_outside_load"]:
        p(f"  {n:6}  {t}")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--target", choices=("serve", "node", "both"), default="both")
    ap.add_argument("--load", type=float, default=480.0, help="seconds of load (default 480)")
    ap.add_argument("--nodus", default=os.path.join(os.environ.get("CARGO_TARGET_DIR", os.path.join(REPO, "target")),
                                                    "release", "nodus"))
    ap.add_argument("--out", default=None)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--reload-every", type=float, default=RELOAD_EVERY,
                    help=f"seconds between SIGHUPs (default {RELOAD_EVERY:g}; 0: none)")
    ap.add_argument("--kill-every", type=float, default=KILL_EVERY,
                    help=f"seconds between kill -9s (default {KILL_EVERY:g}; 0: none)")
    args = ap.parse_args()
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # the finally blocks stop what was started
    if not os.access(args.nodus, os.X_OK):
        sys.exit(f"soak: no nodus binary at {args.nodus} (cargo build --release -p nodus-cli, or --nodus PATH)")
    stamp = _dt.datetime.now().strftime("%Y%m%d-%H%M%S")
    out = args.out or os.path.join(REPO, "bench", "results", f"soak-{stamp}")
    os.makedirs(out, exist_ok=True)
    log(f"results in {out}")
    targets = ["serve", "node"] if args.target == "both" else [args.target]
    for name in targets:
        run_target(name, args, out)


if __name__ == "__main__":
    main()
