#!/usr/bin/env python3
"""nodus side-by-side benchmarks: runs nodus (default features, and with `measure` compiled out),
Node and tokio in the same interleaved rounds on this machine and prints medians and ratios.
Stdlib only (python3 >= 3.8). Normally started by bench/run.sh, which builds the binaries.

Usage:
  python3 bench/bench.py --only micro,http,serve,idle,pool [--rounds N] [--quick] BINARIES...
  python3 bench/bench.py --report bench/results/STAMP/results.json      (re-print the tables)

Sections (SECTIONS below; each needs only its own binaries):
  micro  event-loop microbenchmarks, one process per run (crates/nodus/benches/micro.rs, the peers
         bench/node/micro.js and bench/rust/src/bin/rt_micro.rs)          --nodus --nodus-nomeasure
  http   plaintext "Hello, World!" under `wrk -t1 -c64 -d10s --latency`, server pinned to core 0 and
         wrk to core 1: nodus-http's hello_http example (measure on and off), tokio current_thread +
         hyper (rust hello_hyper), Node `http`                  --hello-http --hello-http-nomeasure
  serve  `nodus serve` against the npm package http-server on Node, a 4 KiB and a 1 MiB file, same wrk
         settings                                                                     --nodus-cli
  idle   server RSS before and with IDLE_CONNS (10,000) idle keep-alive connections, opened by
         bench/idle_conns.py in another process: hello_http, hello_hyper, Node http  --hello-http
  pool   worker-pool benchmarks, one process per run (crates/nodus/benches/pool.rs, the peers
         bench/node/pool.js and bench/rust/src/bin/pool_micro.rs)          --pool --pool-nomeasure

Before every run the harness waits (bounded) until the rest of the machine is quiet; a run
disturbed by more than QUIET_PCT of foreign CPU is repeated (at most twice; not when the gate had given
up, since a repeat would meet the same load: such runs are counted in the noise line). Ratios are taken within
a round, then the median over rounds. Results go to bench/results/<stamp>/ (results.json,
summary.md, and the full wrk output of every HTTP run). Servers are started by this script, listen
on 127.0.0.1 only and are stopped by their PID.
"""
import argparse
import datetime as _dt
import json
import os
import shlex
import statistics
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)
RT_MICRO = os.path.join(HERE, "rust", "target", "release", "rt_micro")
QUIET_PCT = 25.0     # foreign load (% of one core) tolerated before and during a run
QUIET_MAX_WAIT = 60  # s, per run (--quiet-max-wait)
NICE = []            # ["nice", "-n", N] before every measured process (--nice N)
RUN_TIMEOUT = 120    # s, per process
RUNTIMES = ("nodus", "nodus-nomeasure", "node", "tokio")


def log(*a):
    print(*a, file=sys.stderr, flush=True)


# ------------------------------------------------------------------ what runs
def micro_runs(args):
    """(runtime, bench, argv) for one round, grouped by workload so peers run back to back."""
    n = str(args.n)
    nodus = lambda rt, b: (rt, b, [args.nodus if rt == "nodus" else args.nodus_nomeasure, b, n])
    node = lambda b: ("node", b, ["node", "node/micro.js", b, n])
    tokio = lambda b: ("tokio", b, [RT_MICRO, b, n])
    runs = []
    for b, peers in (
        ("immediate", [node("immediate"), tokio("yield")]),
        ("immediate_io", []),
        ("yield", []),
        ("nexttick", [node("nexttick")]),
        ("microtask", [node("microtask"), node("await")]),
        ("spawn_join", [tokio("spawn_join")]),
        ("timers", [node("timers"), tokio("timers_fu")]),
    ):
        runs += [nodus("nodus", b), nodus("nodus-nomeasure", b)] + peers
    return runs


# Table rows: (label, metric, nodus bench, node bench, tokio bench, target (max), target note).
# The target is checked against the default nodus build (measurements on).
ROWS = [
    ("one loop turn: chained immediates", "ns_per_op", "immediate", "immediate", "yield", 150,
     "≤ 150 ns [Node 673, tokio yield 267]"),
    ("  same, one idle fd registered (epoll_wait per turn, like the peers)", "ns_per_op",
     "immediate_io", "immediate", "yield", 150, "≤ 150 ns"),
    ("chained yield_now in a task", "ns_per_op", "yield", None, "yield", None, ""),
    ("chained next_tick", "ns_per_op", "nexttick", "nexttick", None, 25, "≤ 25 ns [Node 66]"),
    ("chained queue_microtask (Node: queueMicrotask)", "ns_per_op", "microtask", "microtask", None, 25,
     "≤ 25 ns"),
    ("chained queue_microtask (Node: await resolved)", "ns_per_op", "microtask", "await", None, 25,
     "≤ 25 ns [Node await 42]"),
    ("spawn 1M + join all", "ns_per_op", "spawn_join", None, "spawn_join", 150, "≤ 150 ns [tokio 365]"),
    ("timers: CPU per timer (tokio: FuturesUnordered<Sleep>)", "cpu_ns_per_timer", "timers", "timers",
     "timers_fu", 300, "≤ 300 ns [Node 834, tokio 1,100]"),
    ("timers: peak memory per timer, bytes", "bytes_per_timer", "timers", "timers", "timers_fu", 80,
     "≤ 80 B [Node 190, tokio 210]"),
    ("timers: insert ns per timer", "insert_ns_per_op", "timers", "timers", "timers_fu", None, ""),
    ("timers: lag, ms (last fire − 999 ms)", "lag_ms", "timers", "timers", "timers_fu", None, ""),
]
OVERHEAD_TARGET = 1.10  # measure on / off, chained immediates


# ------------------------------------------------------------------ machine load
def sys_ticks():
    """(busy, total) jiffies over all CPUs."""
    with open("/proc/stat") as f:
        v = [int(x) for x in f.readline().split()[1:9]]
    busy = v[0] + v[1] + v[2] + v[5] + v[6] + v[7]
    return busy, busy + v[3] + v[4]


def busy_pct(t0, t1):
    """Busy time between two samples in % of ONE core (200 = two cores)."""
    db, dt = t1[0] - t0[0], t1[1] - t0[1]
    return 100.0 * db / dt * os.cpu_count() if dt else 0.0


def wait_quiet(sample=0.5):
    """Waits (at most QUIET_MAX_WAIT s) until other load is under QUIET_PCT; returns (waited s, busy %)."""
    start = time.time()
    while True:
        a = sys_ticks()
        time.sleep(sample)
        busy = busy_pct(a, sys_ticks())
        waited = time.time() - start
        if busy < QUIET_PCT or waited > QUIET_MAX_WAIT:
            return round(waited, 1), round(busy, 1)


def run_one(rt, bench, argv):
    """Runs one benchmark process; returns its JSON record (or None), retrying disturbed runs."""
    import resource
    for attempt in range(1, 4):
        waited, busy_before = wait_quiet()
        s0, ru0, t0 = sys_ticks(), resource.getrusage(resource.RUSAGE_CHILDREN), time.time()
        try:
            p = subprocess.run(NICE + argv, cwd=HERE, capture_output=True, text=True, timeout=RUN_TIMEOUT)
        except subprocess.TimeoutExpired:  # subprocess.run kills the child it started
            log(f"  {rt}/{bench} timed out after {RUN_TIMEOUT}s")
            return None
        wall = time.time() - t0
        ru1, s1 = resource.getrusage(resource.RUSAGE_CHILDREN), sys_ticks()
        own = 100.0 * ((ru1.ru_utime + ru1.ru_stime) - (ru0.ru_utime + ru0.ru_stime)) / wall
        lines = [l for l in p.stdout.splitlines() if l.startswith("{")]
        if p.returncode != 0 or not lines:
            log(f"  {rt}/{bench} FAILED rc={p.returncode}: {p.stderr[-500:]}")
            return None
        r = json.loads(lines[-1])
        if "rss_before_kb" in r and "bytes_per_timer" not in r:  # the peers report the two RSS figures
            r["bytes_per_timer"] = round((r["max_rss_kb"] - r["rss_before_kb"]) * 1024 / r["n"], 1)
        r.update(runtime=rt, name=bench, cmd=" ".join(shlex.quote(a) for a in NICE + argv), attempt=attempt,
                 quiet_wait_s=waited, busy_before_pct=busy_before, gate_gave_up=waited > QUIET_MAX_WAIT,
                 foreign_cpu_pct=round(max(0.0, busy_pct(s0, s1) - own), 1))
        if r["foreign_cpu_pct"] <= QUIET_PCT:
            return r
        if waited > QUIET_MAX_WAIT:  # busy all along: a repeat would only meet the same load
            log(f"  {rt}/{bench}: disturbed (foreign CPU {r['foreign_cpu_pct']}%) after the quiet gate gave up; kept")
            return r
        log(f"  {rt}/{bench}: disturbed (foreign CPU {r['foreign_cpu_pct']}%), again")
    return r


def micro_section(args, results, flush):
    need(args, "nodus", "nodus-nomeasure")
    runs = micro_runs(args)
    for rnd in range(1, args.rounds + 1):
        for rt, bench, argv in runs:
            r = run_one(rt, bench, argv)
            if r:
                r.update(kind="micro", round=rnd)
                results.append(r)
                extra = "".join(f" {k}={r[k]}" for k in ("cpu_ns_per_timer", "bytes_per_timer", "lag_ms") if k in r)
                log(f"[r{rnd}] {rt:16} {bench:12} {r['ns_per_op']:>10} ns/op{extra}"
                    f"  (foreign {r['foreign_cpu_pct']}%)")
        flush()


# ------------------------------------------------------------------ servers (http, serve, idle)
HELLO_HYPER = os.path.join(HERE, "rust", "target", "release", "hello_hyper")
POOL_MICRO = os.path.join(HERE, "rust", "target", "release", "pool_micro")
HTTP_SERVER_JS = os.path.join("node", "node_modules", "http-server", "bin", "http-server")
CLK_TCK = os.sysconf("SC_CLK_TCK")
SERVER_CORE, CLIENT_CORE = "0", "1"
def port_picker(base, span):
    """A next_port(): free 127.0.0.1 ports base, base + 1, ... in turn, wrapping after `span`."""
    state = [base]

    def next_port():
        for _ in range(span):
            port = state[0]
            state[0] = base + (port + 1 - base) % span
            if port_free(port):
                return port
        raise RuntimeError(f"no free port in {base}-{base + span - 1} on 127.0.0.1")
    return next_port


next_port = port_picker(18100, 800)  # every server start gets its own port


def port_free(port):
    import socket
    s = socket.socket()
    try:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        s.bind(("127.0.0.1", port))
        return True
    except OSError:
        return False
    finally:
        s.close()


def wait_port(port, proc, timeout=15.0):
    import socket
    t_end = time.time() + timeout
    while time.time() < t_end and proc.poll() is None:
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.5):
                return True
        except OSError:
            time.sleep(0.05)
    return False


def proc_kb(pid, name, file="status"):
    """A field in kB of /proc/PID/FILE (status: VmRSS, VmHWM; smaps_rollup: Pss), or 0."""
    try:
        with open(f"/proc/{pid}/{file}") as f:
            for line in f:
                if line.startswith(name + ":"):
                    return int(line.split()[1])
    except OSError:
        pass
    return 0


def proc_cpu_ticks(pid):
    """utime + stime of all threads of PID, in clock ticks."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(") ", 1)[1].split()
        return int(fields[11]) + int(fields[12])
    except OSError:
        return 0


def fd_count(pid):
    try:
        return len(os.listdir(f"/proc/{pid}/fd"))
    except OSError:
        return 0


class Server:
    """One server process, pinned with taskset (which execs: the PID is the server's)."""

    def __init__(self, label, argv, logdir, pin=SERVER_CORE):
        self.label, self.port = label, next_port()
        self.argv = [a.format(port=self.port) for a in argv]
        if pin is not None:
            self.argv = NICE + ["taskset", "-c", pin] + self.argv
        self.cmd = " ".join(shlex.quote(a) for a in self.argv)
        self.log = open(os.path.join(logdir, f"server-{label}.log"), "ab")
        self.log.write(f"\n=== {self.cmd}\n".encode())
        self.log.flush()
        self.p = subprocess.Popen(self.argv, cwd=HERE, stdout=self.log, stderr=self.log,
                                  stdin=subprocess.DEVNULL)
        self.pid = self.p.pid
        if not wait_port(self.port, self.p):
            self.stop()
            raise RuntimeError(f"{label} did not open 127.0.0.1:{self.port} ({self.cmd})")
        time.sleep(0.3)

    def rss_kb(self):
        return proc_kb(self.pid, "VmRSS")

    def cpu_s(self):
        return proc_cpu_ticks(self.pid) / CLK_TCK

    def stop(self):
        """SIGTERM to this PID, then SIGKILL to the same PID if it is still there after 5 s."""
        import signal
        if self.p.poll() is None:
            self.p.send_signal(signal.SIGTERM)
            try:
                self.p.wait(timeout=5)
            except subprocess.TimeoutExpired:
                log(f"  {self.label}: no exit 5 s after SIGTERM; SIGKILL to pid {self.pid}")
                self.p.kill()
                self.p.wait(timeout=5)
        self.log.close()


def parse_wrk(out):
    import re
    unit = {"us": 1e-3, "ms": 1.0, "s": 1e3, "m": 60e3}
    size = {"B": 1e-6, "KB": 1024 / 1e6, "MB": 2**20 / 1e6, "GB": 2**30 / 1e6}
    r = {}
    m = re.search(r"Requests/sec:\s+([\d.]+)", out)
    r["rps"] = float(m.group(1)) if m else None
    m = re.search(r"Transfer/sec:\s+([\d.]+)(B|KB|MB|GB)", out)
    r["transfer_mb_s"] = round(float(m.group(1)) * size[m.group(2)], 1) if m else None
    for pct in ("50", "99"):
        m = re.search(rf"^\s+{pct}%\s+([\d.]+)(us|ms|s|m)\s*$", out, re.M)
        r[f"p{pct}_ms"] = float(m.group(1)) * unit[m.group(2)] if m else None
    m = re.search(r"(\d+) requests in", out)
    r["requests"] = int(m.group(1)) if m else None
    m = re.search(r"Socket errors: connect (\d+), read (\d+), write (\d+), timeout (\d+)", out)
    r["socket_errors"] = sum(int(x) for x in m.groups()) if m else 0
    m = re.search(r"Non-2xx or 3xx responses: (\d+)", out)
    r["non2xx"] = int(m.group(1)) if m else 0
    return r


def run_wrk(url, duration, conns):
    argv = NICE + ["taskset", "-c", CLIENT_CORE, "wrk", "-t1", f"-c{conns}", f"-d{duration}s", "--latency", url]
    t0 = time.time()
    try:  # wrk stops itself after `duration`; the cap is for a wedged run only
        p = subprocess.run(argv, capture_output=True, text=True, timeout=duration + 30)
        out = p.stdout + p.stderr
    except subprocess.TimeoutExpired as e:
        out = (e.stdout or b"").decode(errors="replace") + "\n(wrk killed: timeout)"
    return " ".join(argv), out, time.time() - t0


def load_run(args, kind, rt, name, rnd, argv, path):
    """Starts the server, warms it up, measures one wrk run; repeats a disturbed run (at most twice)."""
    import resource
    for attempt in range(1, 4):
        srv = Server(f"{kind}-{rt}-{name}", argv, args.outdir)
        try:
            url = f"http://127.0.0.1:{srv.port}{path}"
            rss_idle = srv.rss_kb()
            run_wrk(url, args.warmup, args.conns)
            waited, busy_before = wait_quiet()
            ru0 = resource.getrusage(resource.RUSAGE_CHILDREN)
            s0, c0, t0 = sys_ticks(), srv.cpu_s(), time.time()
            wcmd, out, wall = run_wrk(url, args.duration, args.conns)
            s1, c1, t1 = sys_ticks(), srv.cpu_s(), time.time()
            ru1 = resource.getrusage(resource.RUSAGE_CHILDREN)
            rss_after, hwm = srv.rss_kb(), proc_kb(srv.pid, "VmHWM")
        finally:
            srv.stop()
        r = parse_wrk(out)
        r.update(kind=kind, runtime=rt, name=name, round=rnd, attempt=attempt, server_cmd=srv.cmd, wrk_cmd=wcmd,
                 server_cpu_pct=round(100.0 * (c1 - c0) / (t1 - t0), 1),
                 wrk_cpu_pct=round(100.0 * ((ru1.ru_utime + ru1.ru_stime) - (ru0.ru_utime + ru0.ru_stime)) / wall, 1),
                 machine_busy_pct=round(busy_pct(s0, s1), 1), quiet_wait_s=waited, busy_before_pct=busy_before,
                 gate_gave_up=waited > QUIET_MAX_WAIT,
                 rss_idle_kb=rss_idle, rss_after_kb=rss_after, max_rss_kb=hwm)
        r["foreign_cpu_pct"] = round(max(0.0, r["machine_busy_pct"] - r["server_cpu_pct"] - r["wrk_cpu_pct"]), 1)
        if r["rps"] and r["server_cpu_pct"]:
            r["req_per_server_cpu_s"] = round(r["rps"] / (r["server_cpu_pct"] / 100.0))
        with open(os.path.join(args.outdir, f"wrk-{kind}-{rt}-{name}-r{rnd}-a{attempt}.txt"), "w") as f:
            f.write(f"# server: {srv.cmd}\n# {wcmd}\n{out}")
        log(f"[{kind} r{rnd}] {rt:16} {name:6} {r['rps'] or 0:>10,.0f} req/s  p50 {r['p50_ms']} ms  p99 {r['p99_ms']} ms"
            f"  server CPU {r['server_cpu_pct']}%  wrk CPU {r['wrk_cpu_pct']}%  "
            f"{r.get('req_per_server_cpu_s') or 0:,} req/CPU-s  errors {r['socket_errors']}+{r['non2xx']}"
            f"  (foreign {r['foreign_cpu_pct']}%)")
        if r["foreign_cpu_pct"] <= QUIET_PCT:
            return r
        if waited > QUIET_MAX_WAIT:  # busy all along: a repeat would only meet the same load
            log(f"  {kind}/{rt}/{name}: disturbed (foreign CPU {r['foreign_cpu_pct']}%) after the quiet gate gave up; kept")
            return r
        log(f"  {kind}/{rt}/{name}: disturbed (foreign CPU {r['foreign_cpu_pct']}%), again")
    return r


def need(args, *names):
    missing = [n for n in names if not getattr(args, n.replace("-", "_"))]
    if missing:
        sys.exit("bench.py: this section needs " + " ".join("--" + n for n in missing) + " (bench/run.sh passes them)")


def http_section(args, results, flush):
    need(args, "hello-http", "hello-http-nomeasure")
    servers = [("nodus", [args.hello_http, "{port}"]),
               ("nodus-nomeasure", [args.hello_http_nomeasure, "{port}"]),
               ("tokio", [HELLO_HYPER, "{port}", "current"]),
               ("node", ["node", "node/http-server.js", "{port}"])]
    for rnd in range(1, args.rounds + 1):
        order = servers if rnd % 2 else [servers[1], servers[0]] + servers[2:]  # on/off alternate first
        for rt, argv in order:
            r = load_run(args, "http", rt, "hello", rnd, argv, "/")
            results.append(r)
            flush()


SERVE_FILES = (("4k", 4096), ("1m", 1 << 20))


def serve_section(args, results, flush):
    import shutil
    import tempfile
    need(args, "nodus-cli")
    if not os.path.exists(os.path.join(HERE, HTTP_SERVER_JS)):
        sys.exit(f"bench.py: {HTTP_SERVER_JS} is missing: (cd bench/node && npm ci)")
    www = tempfile.mkdtemp(prefix="nodus-bench-www-")
    try:
        for name, size in SERVE_FILES:  # incompressible, so that no server could gain by compressing
            with open(os.path.join(www, f"{name}.bin"), "wb") as f:
                f.write(os.urandom(size))
        servers = [("nodus", [args.nodus_cli, "serve", www, "--listen", "127.0.0.1:{port}"]),
                   ("node", ["node", HTTP_SERVER_JS, www, "-a", "127.0.0.1", "-p", "{port}", "-s"])]
        for rnd in range(1, args.rounds + 1):
            for name, _ in SERVE_FILES:
                for rt, argv in servers:
                    r = load_run(args, "serve", rt, name, rnd, argv, f"/{name}.bin")
                    results.append(r)
                    flush()
    finally:
        shutil.rmtree(www, ignore_errors=True)


def idle_run(args, rt, argv, rnd):
    """RSS of a server before and with args.idle_conns idle keep-alive connections."""
    srv = Server(f"idle-{rt}", argv, args.outdir)
    client = None
    try:
        time.sleep(0.7)
        before, fds_before = srv.rss_kb(), fd_count(srv.pid)
        client = subprocess.Popen(NICE + ["taskset", "-c", CLIENT_CORE, sys.executable, os.path.join(HERE, "idle_conns.py"),
                                   str(srv.port), str(args.idle_conns)],
                                  stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        ready = client.stdout.readline().split()  # the client gives up by itself after 60 s
        if not ready or ready[0] != "ready":
            raise RuntimeError(f"idle client for {rt} did not get ready: {ready}")
        opened, failed, secs = int(ready[1]), int(ready[2]), float(ready[3])
        time.sleep(0.5)  # let the server settle (hello_http closes idle connections after 5 s)
        after, hwm, fds = srv.rss_kb(), proc_kb(srv.pid, "VmHWM"), fd_count(srv.pid)
        client.stdin.write("check\n")
        client.stdin.flush()
        still = int(client.stdout.readline().split()[1])
    finally:
        if client:
            try:
                client.stdin.close()
                client.wait(timeout=30)
            except (OSError, subprocess.TimeoutExpired):
                client.kill()
                client.wait()
        srv.stop()
    r = dict(kind="idle", runtime=rt, name="idle", round=rnd, server_cmd=srv.cmd, conns=args.idle_conns,
             opened=opened, failed=failed, open_after_measure=still, connect_s=secs,
             rss_before_kb=before, rss_after_kb=after, max_rss_kb=hwm, fds_before=fds_before, fds_after=fds,
             server_conns=fds - fds_before)
    r["bytes_per_conn"] = round((after - before) * 1024 / opened) if opened else None
    log(f"[idle r{rnd}] {rt:16} RSS {before:,} kB -> {after:,} kB with {opened:,} connections "
        f"({r['bytes_per_conn']} B each; failed {failed}; server fds +{fds - fds_before}; still open {still}; "
        f"opened in {secs} s)")
    return r


def idle_section(args, results, flush):
    import resource
    need(args, "hello-http")
    soft = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
    if soft < args.idle_conns + 100:
        sys.exit(f"bench.py: RLIMIT_NOFILE is {soft}; the idle section needs {args.idle_conns + 100} "
                 "(bench/run.sh raises it with ulimit -n)")
    servers = [("nodus", [args.hello_http, "{port}"]),
               ("tokio", [HELLO_HYPER, "{port}", "current"]),
               ("node", ["node", "node/http-server.js", "{port}"])]
    for rnd in range(1, args.rounds + 1):
        for rt, argv in servers:
            results.append(idle_run(args, rt, argv, rnd))
            flush()


POOL_BENCHES = (  # nodus bench, Node bench or None, tokio bench or None
    ("pool_trivial", "pool_trivial", "pool_trivial"),
    ("stat", "stat", "stat"),
    ("pbkdf2", "pbkdf2", None),
    ("read_1g", "read_1g", "read_1g"),
    ("gzip", "gzip", None),
)


def pool_section(args, results, flush):
    need(args, "pool", "pool-nomeasure")
    runs = []
    for b, node_b, tokio_b in POOL_BENCHES:
        runs += [("nodus", b, [args.pool, b]), ("nodus-nomeasure", b, [args.pool_nomeasure, b])]
        if node_b:
            runs.append(("node", node_b, ["node", "node/pool.js", node_b]))
        if tokio_b:
            runs.append(("tokio", tokio_b, [POOL_MICRO, tokio_b]))
    for rnd in range(1, args.rounds + 1):
        for rt, bench, argv in runs:
            r = run_one(rt, bench, argv)
            if r:
                r.update(kind="pool", round=rnd)
                results.append(r)
                extra = f" {r['mb_per_s']} MB/s" if "mb_per_s" in r else ""
                log(f"[pool r{rnd}] {rt:16} {bench:12} {r['ns_per_op']:>10} ns/op{extra}"
                    f"  (foreign {r['foreign_cpu_pct']}%)")
        flush()


SECTIONS = {"micro": micro_section, "http": http_section, "serve": serve_section, "idle": idle_section,
            "pool": pool_section}
DEFAULT_ROUNDS = {"micro": 5, "http": 3, "serve": 3, "idle": 3, "pool": 3}


# ------------------------------------------------------------------ report
def med(xs):
    xs = [x for x in xs if x is not None]
    return statistics.median(xs) if xs else None


def fmt(v, metric):
    if v is None:
        return "–"
    return f"{v:,.0f}" if abs(v) >= 100 or metric == "lag_ms" and abs(v) >= 10 else f"{v:,.1f}"


def micro_report(results):
    micro = [r for r in results if r.get("kind") == "micro"]
    if not micro:
        return None
    rounds = sorted({r["round"] for r in micro})

    def get(rt, bench, metric, rnd=None):
        return [r.get(metric) for r in micro if r["runtime"] == rt and r["name"] == bench
                and (rnd is None or r["round"] == rnd)]

    def ratio(a_rt, a_b, b_rt, b_b, metric):
        """Median over rounds of (a / b) taken within each round."""
        xs = []
        for rnd in rounds:
            a, b = med(get(a_rt, a_b, metric, rnd)), med(get(b_rt, b_b, metric, rnd))
            if a is not None and b:
                xs.append(a / b)
        return med(xs)

    def spread(rt, bench, metric):
        xs = [x for x in get(rt, bench, metric) if x is not None]
        return f" ({fmt(min(xs), metric)}–{fmt(max(xs), metric)})" if len(xs) > 1 else ""

    out = [f"Medians of {len(rounds)} interleaved rounds (min–max for nodus). Ratios are taken within each round, "
           "then the median; a time ratio below 1 means nodus is faster.", "",
           "| benchmark | nodus (measure on) | nodus (measure off) | Node | tokio | nodus ÷ Node | nodus ÷ tokio "
           "| measure on ÷ off | target | met? |",
           "|---|---|---|---|---|---|---|---|---|---|"]
    for label, metric, nb, node_b, tokio_b, target, note in ROWS:
        v = med(get("nodus", nb, metric))
        if v is None:
            continue
        cells = [f"{fmt(v, metric)}{spread('nodus', nb, metric)}", fmt(med(get("nodus-nomeasure", nb, metric)), metric)]
        cells.append(fmt(med(get("node", node_b, metric)), metric) if node_b else "–")
        cells.append(fmt(med(get("tokio", tokio_b, metric)), metric) if tokio_b else "–")
        for peer_rt, peer_b in (("node", node_b), ("tokio", tokio_b)):
            q = ratio("nodus", nb, peer_rt, peer_b, metric) if peer_b and metric != "lag_ms" else None
            cells.append(f"{q:.2f}" if q is not None else "–")
        q = ratio("nodus", nb, "nodus-nomeasure", nb, metric) if metric != "lag_ms" else None
        cells.append(f"{q:.2f}" if q is not None else "–")
        if target is None:
            verdict = ""
        elif v <= target:
            verdict = "yes"
        else:
            verdict = f"**no: {v / target:.1f}× the target**"
        out.append(f"| {label} | " + " | ".join(cells) + f" | {note} | {verdict} |")
    q = ratio("nodus", "immediate", "nodus-nomeasure", "immediate", "ns_per_op")
    if q is not None:
        ok = "met" if q <= OVERHEAD_TARGET else f"**missed: {100 * (q - 1):.0f}% overhead**"
        out += ["", f"Measurement overhead on chained immediates (measure on ÷ off, same round): {q:.2f} "
                f"(target ≤ {OVERHEAD_TARGET:.2f}): {ok}."]
    worst = max((r.get("foreign_cpu_pct", 0) for r in micro), default=0)
    retried = sum(1 for r in micro if r.get("attempt", 1) > 1)
    waited = max((r.get("quiet_wait_s", 0) for r in micro), default=0)
    out += ["", f"Noise: highest foreign CPU during a kept run {worst:.0f}% of a core; {retried} run(s) repeated "
            f"for foreign load over {QUIET_PCT:.0f}%; longest quiet-gate wait {waited:.0f} s."]
    return "\n".join(out)


def median_by_round(rs, metric, **where):
    """{round: median of metric} over the results whose fields equal `where`."""
    out = {}
    for rnd in sorted({r["round"] for r in rs}):
        v = med([r.get(metric) for r in rs
                 if r["round"] == rnd and all(r.get(k) == want for k, want in where.items())])
        if v is not None:
            out[rnd] = v
    return out


def by_round(rs, rt, name, metric):
    """{round: median of metric} for one runtime and bench."""
    return median_by_round(rs, metric, runtime=rt, name=name)


def round_ratios(rs, a, b, metric):
    """Per-round a / b, a and b being (runtime, bench); returns (median, [per round])."""
    ra, rb = by_round(rs, *a, metric), by_round(rs, *b, metric)
    xs = [ra[k] / rb[k] for k in ra if k in rb and rb[k]]
    return med(xs), xs


def cell(rs, rt, name, metric, f="{:,.0f}", spread=False):
    xs = [r.get(metric) for r in rs if r["runtime"] == rt and r["name"] == name and r.get(metric) is not None]
    if not xs:
        return "–"
    s = f.format(med(xs))
    return s + (f" ({f.format(min(xs))}–{f.format(max(xs))})" if spread and len(xs) > 1 else "")


def noise_line(rs):
    worst = max((r.get("foreign_cpu_pct", 0) for r in rs), default=0)
    retried = sum(1 for r in rs if r.get("attempt", 1) > 1)
    waited = max((r.get("quiet_wait_s", 0) for r in rs), default=0)
    gave_up = sum(1 for r in rs if r.get("gate_gave_up"))
    median_foreign = med([r.get("foreign_cpu_pct") for r in rs]) or 0
    errors = sum(r.get("socket_errors", 0) + r.get("non2xx", 0) for r in rs)
    return (f"Noise: foreign CPU during the kept runs: median {median_foreign:.0f}%, highest {worst:.0f}% of a core; "
            f"{retried} run(s) repeated for foreign load over {QUIET_PCT:.0f}%; longest quiet-gate wait {waited:.0f} s; "
            f"{gave_up} run(s) started after the gate gave up"
            + (f"; wrk socket errors + non-2xx responses: {errors}." if any("rps" in r for r in rs) else "."))


HTTP_TARGET_EFFICIENCY = 1.05  # nodus (measure on) req per server CPU-s ÷ tokio + hyper's
HTTP_OVERHEAD_TARGET = 0.02    # server CPU per request, measure on ÷ off − 1
HTTP_LABELS = (("nodus", "nodus hello_http (measure on)"), ("nodus-nomeasure", "nodus hello_http (measure off)"),
               ("tokio", "tokio current_thread + hyper"), ("node", "Node http"))


def load_table(rs, name, labels, peers):
    """Rows of a wrk table; efficiency ratios (req per server CPU-s) against each (peer runtime, column)."""
    out = []
    for rt, label in labels:
        if not any(r["runtime"] == rt and r["name"] == name for r in rs):
            continue
        ratios = []
        for peer in peers:
            q = round_ratios(rs, (rt, name), (peer, name), "req_per_server_cpu_s")[0] if rt != peer else None
            ratios.append(f"{q:.2f}" if q is not None else "–")
        rss = cell(rs, rt, name, "rss_after_kb", "{:,.0f}")
        out.append(f"| {label} | {cell(rs, rt, name, 'rps', spread=True)} | {cell(rs, rt, name, 'transfer_mb_s', '{:,.1f}')} "
                   f"| {cell(rs, rt, name, 'p50_ms', '{:.2f}')} | {cell(rs, rt, name, 'p99_ms', '{:.2f}')} "
                   f"| {cell(rs, rt, name, 'server_cpu_pct')} | {cell(rs, rt, name, 'wrk_cpu_pct')} "
                   f"| {cell(rs, rt, name, 'req_per_server_cpu_s', spread=True)} | " + " | ".join(ratios) + f" | {rss} |")
    return out


def http_report(results):
    rs = [r for r in results if r.get("kind") == "http"]
    if not rs:
        return None
    n = len({r["round"] for r in rs})
    out = [f"Medians of {n} interleaved rounds (min–max for req/s and req per CPU-s). `wrk -t1 -c64 -d10s --latency`, "
           "server on core 0 and wrk on core 1. Efficiency ratios: requests per server CPU-second ÷ the peer's, "
           "taken within each round, then the median (above 1 = nodus does more work per CPU-second).", "",
           "| server | req/s | MB/s | p50 ms | p99 ms | server CPU % | wrk CPU % | req per server CPU-s "
           "| ÷ tokio+hyper | ÷ Node | RSS after load, kB |",
           "|---|---|---|---|---|---|---|---|---|---|---|"]
    out += load_table(rs, "hello", HTTP_LABELS, ("tokio", "node"))
    q, xs = round_ratios(rs, ("nodus", "hello"), ("tokio", "hello"), "req_per_server_cpu_s")
    if q is not None:
        per = ", ".join(f"{x:.2f}" for x in xs)
        verdict = ("met" if q >= HTTP_TARGET_EFFICIENCY else
                   f"**missed**: {100 * (HTTP_TARGET_EFFICIENCY / q - 1):.1f} % more requests per CPU-second needed")
        out += ["", f"Target ≥ {HTTP_TARGET_EFFICIENCY:.2f}× tokio+hyper in requests per server CPU-second (measure on): "
                f"{q:.2f}× (rounds: {per}): {verdict}."]
    q, xs = round_ratios(rs, ("nodus-nomeasure", "hello"), ("nodus", "hello"), "req_per_server_cpu_s")
    if q is not None:
        per = ", ".join(f"{100 * (x - 1):+.1f} %" for x in xs)
        ov = q - 1
        verdict = "met" if ov <= HTTP_OVERHEAD_TARGET else f"**missed by {100 * (ov - HTTP_OVERHEAD_TARGET):.1f} points**"
        out += ["", f"Measurement overhead (server CPU per request, measure on ÷ off − 1): {100 * ov:+.1f} % "
                f"(rounds: {per}; target ≤ {100 * HTTP_OVERHEAD_TARGET:.0f} %): {verdict}."]
    out += ["", noise_line(rs)]
    return "\n".join(out)


def serve_report(results):
    rs = [r for r in results if r.get("kind") == "serve"]
    if not rs:
        return None
    n = len({r["round"] for r in rs})
    out = [f"Medians of {n} interleaved rounds (min–max for req/s and req per CPU-s); same wrk settings and pinning as "
           "the HTTP table. Ratios within each round, then the median.", "",
           "| file | server | req/s | MB/s | p50 ms | p99 ms | server CPU % | wrk CPU % | req per server CPU-s "
           "| req per CPU-s ÷ http-server | req/s ÷ http-server | RSS after load, kB |",
           "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for name, size in SERVE_FILES:
        for rt, label in (("nodus", "nodus serve"), ("node", "http-server (Node)")):
            if not any(r["runtime"] == rt and r["name"] == name for r in rs):
                continue
            q1 = round_ratios(rs, (rt, name), ("node", name), "req_per_server_cpu_s")[0] if rt != "node" else None
            q2 = round_ratios(rs, (rt, name), ("node", name), "rps")[0] if rt != "node" else None
            out.append(f"| {size // 1024:,} KiB | {label} | {cell(rs, rt, name, 'rps', spread=True)} "
                       f"| {cell(rs, rt, name, 'transfer_mb_s', '{:,.1f}')} | {cell(rs, rt, name, 'p50_ms', '{:.2f}')} "
                       f"| {cell(rs, rt, name, 'p99_ms', '{:.2f}')} | {cell(rs, rt, name, 'server_cpu_pct')} "
                       f"| {cell(rs, rt, name, 'wrk_cpu_pct')} | {cell(rs, rt, name, 'req_per_server_cpu_s', spread=True)} "
                       f"| {'–' if q1 is None else f'{q1:.2f}'} | {'–' if q2 is None else f'{q2:.2f}'} "
                       f"| {cell(rs, rt, name, 'rss_after_kb')} |")
    out += ["", noise_line(rs)]
    return "\n".join(out)


def idle_report(results):
    rs = [r for r in results if r.get("kind") == "idle"]
    if not rs:
        return None
    n = len({r["round"] for r in rs})
    conns = rs[0]["conns"]
    out = [f"Medians of {n} rounds (min–max for bytes per connection). VmRSS of the server process before and with "
           f"{conns:,} idle keep-alive connections (each answered one request); bytes per connection = "
           "(after − before) ÷ connections; ratios within each round, then the median.", "",
           "| server | RSS before, kB | RSS with the connections, kB | bytes per connection | ÷ tokio+hyper | ÷ Node "
           "| connections answered (failed) | still open when measured |",
           "|---|---|---|---|---|---|---|---|"]
    for rt, label in (("nodus", "nodus hello_http (measure on)"), ("tokio", "tokio current_thread + hyper"),
                      ("node", "Node http")):
        if not any(r["runtime"] == rt for r in rs):
            continue
        ratios = []
        for peer in ("tokio", "node"):
            q = round_ratios(rs, (rt, "idle"), (peer, "idle"), "bytes_per_conn")[0] if rt != peer else None
            ratios.append("–" if q is None else f"{q:.2f}")
        mine = [r for r in rs if r["runtime"] == rt]
        out.append(f"| {label} | {cell(rs, rt, 'idle', 'rss_before_kb')} | {cell(rs, rt, 'idle', 'rss_after_kb')} "
                   f"| {cell(rs, rt, 'idle', 'bytes_per_conn', spread=True)} | " + " | ".join(ratios) +
                   f" | {min(r['opened'] for r in mine):,}–{max(r['opened'] for r in mine):,} "
                   f"({max(r['failed'] for r in mine)}) | {min(r['open_after_measure'] for r in mine):,} |")
    return "\n".join(out)


# label, value metric, ratio metric (a time: below 1 = nodus faster), nodus/node/tokio bench, target, note
POOL_ROWS = [
    ("pool round trip, trivial job (Node: crypto.randomFill 1 byte; tokio: spawn_blocking, max 4 threads), ns",
     "ns_per_op", "ns_per_op", "pool_trivial", "pool_trivial", "pool_trivial", 600, "≤ 0.6 µs [tokio 0.87 µs]"),
    ("stat /etc/hostname (Node fs.stat; tokio spawn_blocking(metadata)), ns", "ns_per_op", "ns_per_op", "stat", "stat",
     "stat", 900, "≤ 0.9 µs [Node 2.9 µs]"),
    ("pbkdf2-sha256, 1 iteration, 32 bytes, ns", "ns_per_op", "ns_per_op", "pbkdf2", "pbkdf2", None, 1200,
     "≤ 1.2 µs [Node 4.0 µs]"),
    ("read a 1 GiB file as a stream, 64 KiB chunks (page cache), MB/s", "mb_per_s", "total_ms", "read_1g", "read_1g",
     "read_1g", None, ""),
    ("gzip level 6, 64 MiB of text in 64 KiB writes, MB/s of input", "mb_per_s", "total_ms", "gzip", "gzip", None, None,
     ""),
]


def pool_report(results):
    rs = [r for r in results if r.get("kind") == "pool"]
    if not rs:
        return None
    n = len({r["round"] for r in rs})
    out = [f"Medians of {n} interleaved rounds (min–max for nodus); 100k operations with 64 in flight unless said "
           "otherwise. Ratios are of time (for the MB/s rows, of the time the whole stream took), taken within each "
           "round, then the median: below 1 means nodus is faster.", "",
           "| benchmark | nodus (measure on) | nodus (measure off) | Node | tokio | nodus ÷ Node | nodus ÷ tokio "
           "| measure on ÷ off | target | met? |",
           "|---|---|---|---|---|---|---|---|---|---|"]
    for label, metric, rmetric, nb, node_b, tokio_b, target, note in POOL_ROWS:
        f = "{:,.0f}" if metric == "ns_per_op" else "{:,.1f}"
        if not any(r["runtime"] == "nodus" and r["name"] == nb for r in rs):
            continue
        cells = [cell(rs, "nodus", nb, metric, f, spread=True), cell(rs, "nodus-nomeasure", nb, metric, f),
                 cell(rs, "node", node_b, metric, f) if node_b else "–",
                 cell(rs, "tokio", tokio_b, metric, f) if tokio_b else "–"]
        for peer, pb in (("node", node_b), ("tokio", tokio_b), ("nodus-nomeasure", nb)):
            q = round_ratios(rs, ("nodus", nb), (peer, pb), rmetric)[0] if pb else None
            cells.append("–" if q is None else f"{q:.2f}")
        v = med([r.get(metric) for r in rs if r["runtime"] == "nodus" and r["name"] == nb])
        verdict = "" if target is None else "yes" if v <= target else f"**no: {v / target:.2f}× the target**"
        out.append(f"| {label} | " + " | ".join(cells) + f" | {note} | {verdict} |")
    out += ["", noise_line(rs)]
    return "\n".join(out)


def report(results):
    parts = [(title, f(results)) for title, f in (
        ("Event-loop microbenchmarks (micro)", micro_report), ("HTTP plaintext (http)", http_report),
        ("nodus serve against http-server (serve)", serve_report),
        ("Idle keep-alive connections (idle)", idle_report), ("Worker pools (pool)", pool_report))]
    parts = [f"### {t}\n\n{p}" for t, p in parts if p]
    return "\n\n".join(parts) if parts else "(no results)"


# ------------------------------------------------------------------ environment
def sh(cmd, cwd=REPO):
    p = subprocess.run(cmd, shell=True, capture_output=True, text=True, cwd=cwd)
    return (p.stdout.strip() or p.stderr.strip()).splitlines()[0] if (p.stdout or p.stderr) else "?"


def lock_version(lock_path, crate):
    try:
        lock = open(lock_path).read()
    except OSError:
        return "?"
    key = f'name = "{crate}"\nversion = "'
    return lock.split(key, 1)[1].split('"', 1)[0] if key in lock else "?"


PROFILE = "release profile (opt-level 3, lto fat, codegen-units 1)"


def environment(args, sections):
    model = next((l.split(":", 1)[1].strip() for l in open("/proc/cpuinfo") if l.startswith("model name")), "?")
    mem_kb = next((int(l.split()[1]) for l in open("/proc/meminfo") if l.startswith("MemTotal")), 0)
    peers_lock = os.path.join(HERE, "rust", "Cargo.lock")
    tokio, hyper = lock_version(peers_lock, "tokio"), lock_version(peers_lock, "hyper")
    nodus_hyper = lock_version(os.path.join(REPO, "Cargo.lock"), "hyper")
    dirty = subprocess.run(["git", "status", "--porcelain", "--", "crates", "Cargo.toml", "Cargo.lock"], cwd=REPO,
                           capture_output=True, text=True).stdout.strip()
    env = {
        "machine": f"nproc={os.cpu_count()}; {model}; {mem_kb / 2**20:.0f} GiB RAM; kernel {os.uname().release}",
        "node": sh("node --version"), "rustc": sh("rustc --version"), "tokio": tokio,
        "nodus_commit": sh("git log -1 --format='%H %s'") + (" + uncommitted changes in crates/" if dirty else ""),
        "sections": ",".join(sections),
        "builds": {},
    }
    b = env["builds"]
    if "micro" in sections:
        b["micro nodus"] = (f"{args.nodus}: cargo bench profile (= release: opt-level 3, lto fat, codegen-units 1), "
                            "default features [measure]")
        b["micro nodus-nomeasure"] = f"{args.nodus_nomeasure}: same profile, --no-default-features (measure off)"
        b["micro tokio"] = f"{RT_MICRO}: tokio {tokio} current_thread, release, lto fat, --locked"
        env["n"] = args.n
    if {"http", "serve", "idle"} & set(sections):
        env["wrk"] = sh("wrk -v 2>&1 | head -1")
        env["hyper"] = f"{nodus_hyper} (nodus-http), {hyper} (tokio peer)"
    if {"http", "idle"} & set(sections):
        b["http nodus"] = (f"{args.hello_http}: cargo build --release -p nodus-http --example hello_http, {PROFILE}, "
                           "default features (nodus's measure on)")
        b["http tokio"] = f"{HELLO_HYPER} PORT current: tokio {tokio} current_thread + hyper {hyper}, release, lto fat"
        b["http node"] = "node node/http-server.js PORT (http.createServer, keepAliveTimeout 65 s)"
    if "http" in sections:
        b["http nodus-nomeasure"] = f"{args.hello_http_nomeasure}: {PROFILE}, {args.hello_http_nomeasure_how}"
    if "serve" in sections:
        env["http-server"] = sh(f"node {HTTP_SERVER_JS} -v", cwd=HERE)
        b["serve nodus"] = (f"{args.nodus_cli} serve DIR --listen 127.0.0.1:PORT: cargo build --release -p nodus-cli, "
                            f"{PROFILE}, default features (measure on)")
        b["serve node"] = f"node {HTTP_SERVER_JS} DIR -a 127.0.0.1 -p PORT -s (npm http-server, bench/node/package-lock.json)"
    if "pool" in sections:
        b["pool nodus"] = f"{args.pool}: cargo bench profile, default features [measure]"
        b["pool nodus-nomeasure"] = f"{args.pool_nomeasure}: same profile, --no-default-features (measure off)"
        b["pool tokio"] = f"{POOL_MICRO}: tokio {tokio} current_thread, spawn_blocking max 4 threads, release, lto fat"
        b["pool node"] = "node node/pool.js BENCH (UV_THREADPOOL_SIZE unset: 4)"
    return env


def raise_nofile():
    """Soft RLIMIT_NOFILE up to 65536 if allowed (the idle section's servers and client inherit it)."""
    import resource
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    for want in ((65536, max(hard, 65536)), (hard, hard)):
        try:
            if soft < want[0]:
                resource.setrlimit(resource.RLIMIT_NOFILE, want)
            return
        except (ValueError, OSError):
            continue


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--only", default=",".join(SECTIONS), help="comma-separated sections: " + ",".join(SECTIONS))
    ap.add_argument("--rounds", type=int, help="rounds of every section (default: micro 5, the others 3)")
    ap.add_argument("--quick", action="store_true",
                    help="a smoke run, not for claims: 2 rounds, micro 200k ops, wrk 3 s after 1 s of warm-up")
    ap.add_argument("--report", help="only print the tables of an existing results.json")
    ap.add_argument("--nodus", help="micro: the micro bench binary, default features")
    ap.add_argument("--nodus-nomeasure", help="micro: the micro bench binary built with --no-default-features")
    ap.add_argument("--n", type=int, default=1_000_000, help="micro: ops per run (timers too)")
    ap.add_argument("--hello-http", help="http, idle: hello_http, default features")
    ap.add_argument("--hello-http-nomeasure", help="http: hello_http with nodus's measure feature off")
    ap.add_argument("--hello-http-nomeasure-how", default="nodus-http --no-default-features (its measure feature, passed on to nodus, off), in target/bench-nomeasure",
                    help="how that build turned measure off (recorded with the results)")
    ap.add_argument("--nodus-cli", help="serve: the nodus binary")
    ap.add_argument("--pool", help="pool: the pool bench binary, default features")
    ap.add_argument("--pool-nomeasure", help="pool: the pool bench binary built with --no-default-features")
    ap.add_argument("--duration", type=int, default=10, help="http, serve: seconds of each measured wrk run")
    ap.add_argument("--warmup", type=int, default=3, help="http, serve: seconds of wrk warm-up (discarded)")
    ap.add_argument("--conns", type=int, default=64, help="http, serve: wrk connections")
    ap.add_argument("--idle-conns", type=int, default=10_000, help="idle: connections")
    ap.add_argument("--quiet-max-wait", type=float, default=60,
                    help="most seconds to wait for a quiet machine before each run")
    ap.add_argument("--nice", type=int, default=0,
                    help="run servers, wrk, the idle client and benchmark processes under `nice -n N` "
                         "(e.g. -20 as root, on a machine shared with CPU-bound processes)")
    args = ap.parse_args()
    if args.report:
        print(report(json.load(open(args.report))["results"]))
        return
    sections = [s for s in args.only.split(",") if s]
    unknown = [s for s in sections if s not in SECTIONS]
    if unknown:
        ap.error(f"unknown section(s) {','.join(unknown)}; sections: {','.join(SECTIONS)}")
    if args.quick:
        args.n, args.rounds, args.duration, args.warmup = 200_000, args.rounds or 2, 3, 1
    raise_nofile()
    globals()["QUIET_MAX_WAIT"] = args.quiet_max_wait
    if args.nice:
        NICE[:] = ["nice", "-n", str(args.nice)]
    stamp = _dt.datetime.now().strftime("%Y%m%d-%H%M%S")
    args.outdir = outdir = os.path.join(HERE, "results", stamp)
    os.makedirs(outdir)
    env = environment(args, sections)
    env["command"] = " ".join(shlex.quote(a) for a in sys.argv)
    env["rounds"] = {s: args.rounds or DEFAULT_ROUNDS[s] for s in sections}
    env["quiet_gate"] = f"wait until other load < {QUIET_PCT:.0f}% of a core, at most {args.quiet_max_wait:g} s"
    env["nice"] = args.nice
    results = []

    def flush():
        with open(os.path.join(outdir, "results.json"), "w") as f:
            json.dump({"environment": env, "results": results}, f, indent=1)

    log("environment: " + json.dumps(env, indent=1))
    rounds = args.rounds
    for name in sections:
        args.rounds = env["rounds"][name]
        t0 = time.time()
        SECTIONS[name](args, results, flush)
        env.setdefault("section_minutes", {})[name] = round((time.time() - t0) / 60, 1)
        flush()
    args.rounds = rounds
    text = "\n".join(f"- {k}: {v}" for k, v in env.items() if k != "builds")
    text += "\n" + "\n".join(f"- build {k}: {v}" for k, v in env["builds"].items())
    text += "\n\n" + report(results) + "\n"
    with open(os.path.join(outdir, "summary.md"), "w") as f:
        f.write(text)
    print(text)
    log(f"results in {outdir}")


if __name__ == "__main__":
    main()
