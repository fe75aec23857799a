#!/usr/bin/env python3
"""Cluster benchmarks: nodus cluster against Node `cluster` and PM2 cluster mode, 2 workers, side by side
in one interleaved run. Stdlib only (python3 >= 3.8). Normally started by `bench/run.sh --only cluster`,
which builds the binaries and installs PM2 (bench/node/package-lock.json).

Usage:
  python3 bench/cluster/run.py [--rounds N] [--quick] [--cluster PATH] [--nodus-cli PATH] [--hello-http PATH]
                               [--handoff-floor PATH]
  python3 bench/cluster/run.py --report bench/results/cluster-STAMP/results.json   (re-print the tables)

Servers (CONFIGS; all serve the same hello world on 127.0.0.1):
  nodus-POLICY  target/release/examples/cluster --workers 2 --policy POLICY, POLICY = rr shared reuseport least
  nodus-node    nodus run -w 2 --node -- node app.js: stock Node workers under a nodus primary (rr)
  node-rr, node-none   node primary.js: Node `cluster`, NODE_CLUSTER_SCHED_POLICY=rr / none
  pm2           pm2 start app.js -i 2: PM2 cluster mode, private PM2_HOME (bench/cluster/pm2-home),
                `pm2 kill` after every round so each round has a fresh daemon
  nodus-single, node-single   one process: hello_http (the http section's nodus server), node app.js
  floor-one, floor-rr   bench/cluster/handoff_floor.c (close only): nodus's rr handoff in bare C, and its one
                process; the close row also gives floor-rr's CPU over floor-one's, the handoff's kernel price
Measures, in this order on one fresh start per server and round (MEASURE_ORDER):
  memory     after SETTLE s idle: VmRSS and Pss (smaps_rollup) summed over the primary and its workers
  close      wrk -t1 -c32 -d10s -H 'Connection: close' after a 2 s warm-up: new connections per second and
             server CPU per connection: time on a CPU of every thread of the process tree, from the
             scheduler's account (/proc/PID/task/TID/schedstat; utime + stime, tick samples, are kept in
             results.json as cpu_us_per_req_ticks)
  keepalive  wrk -t1 -c64 -d10s after a 3 s warm-up: requests per server CPU-second, and where that CPU goes:
             user space against the kernel (the schedstat total split by the utime/stime share) and the
             servers' sleeps (voluntary context switches) and preemptions per request
  reload     SIGHUP to the idle primary → its reload_done event (PM2: `pm2 reload` wall time)
  kill9      SIGKILL to an idle worker → the next listening/ready event of its slot, slots in turn, KILL_GAP s
             apart (longer than nodus's 1 s min uptime, so no restart backoff applies)
Events (nodus's --events FILE, and primary.js): JSON lines {"t_ns": CLOCK_MONOTONIC ns, "event", "worker": slot,
"pid"}; Python's time.monotonic_ns() reads the same clock.

Noise: before every measured run the harness waits (at most --quiet-max-wait s) until other load is under
QUIET_PCT of a core; a load run with more foreign CPU than that is repeated (at most twice). Nothing is pinned
(2 workers need both cores). Servers start in their own session and are stopped by PID and process group,
also on errors and Ctrl-C. Results: bench/results/cluster-STAMP.md (the tables, also on stdout) and
bench/results/cluster-STAMP/ (results.json, every wrk output, event log and server log).

The measures and their /proc and wrk helpers are adapted from shared/reliability-anchors/ra.py, with which
the issue's anchors were measured; app.js and primary.js are copied from the same place.
"""
import argparse
import datetime as _dt
import json
import os
import re
import shlex
import signal
import socket
import statistics
import subprocess
import sys
import time
import traceback
from collections import namedtuple

# The machine-load, median, port and /proc helpers of the other sections (bench/bench.py,
# stdlib only and side-effect free to import).
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from bench import busy_pct, med, median_by_round, port_free, port_picker, proc_kb, sys_ticks  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
BENCH = os.path.dirname(HERE)
REPO = os.path.dirname(BENCH)
APP_JS = os.path.join(HERE, "app.js")
PRIMARY_JS = os.path.join(HERE, "primary.js")
PM2 = os.path.join(BENCH, "node", "node_modules", ".bin", "pm2")
PM2_HOME = os.path.join(HERE, "pm2-home")
PM2_APP = "bench-app"
CLK_TCK = os.sysconf("SC_CLK_TCK")
WORKERS = 2
QUIET_PCT = 25.0     # foreign load (% of one core) tolerated before and during a run
QUIET_MAX_WAIT = 60  # s (--quiet-max-wait)
NICE = []            # ["nice", "-n", N] before every server and wrk (--nice N)
KILL_GAP = 1.5       # s between two kills
PORT_BASE, PORT_SPAN = 19100, 400  # every server start gets its own port; bench.py uses 18100-18899

Config = namedtuple("Config", "key label kind policy measures")
CLUSTER_MEASURES = ("memory", "close", "keepalive", "reload", "kill9")
CONFIGS = [Config(f"nodus-{p}", f"nodus cluster {p}", "nodus", p, CLUSTER_MEASURES)
           for p in ("rr", "shared", "reuseport", "least")] + [
    Config("nodus-node", "Node app under nodus primary (rr)", "nodus-node", "rr", CLUSTER_MEASURES),
    Config("node-rr", "Node cluster rr", "node", "rr", CLUSTER_MEASURES),
    Config("node-none", "Node cluster none", "node", "none", ("memory", "close", "keepalive")),
    Config("pm2", "PM2 -i 2", "pm2", None, ("memory", "close", "keepalive", "reload")),
    Config("nodus-single", "nodus 1 process", "nodus-single", None, ("close", "keepalive")),
    Config("node-single", "Node 1 process", "node-single", None, ("close", "keepalive")),
    Config("floor-one", "bare C, 1 process", "floor", "one", ("close",)),
    Config("floor-rr", "bare C handoff, rr", "floor", "rr", ("close",)),
]
MEASURE_ORDER = ("memory", "close", "keepalive", "reload", "kill9")
NODUS_KINDS = ("nodus", "nodus-node", "nodus-single")
EVENT_KINDS = ("nodus", "nodus-node", "node")

LIVE = []  # servers and wrk processes to stop on the way out


def one_process(cfg):
    """A server of one process, no primary: nodus-single, node-single, floor-one."""
    return cfg.kind.endswith("single") or cfg.policy == "one"


def log(*a):
    print(time.strftime("%H:%M:%S"), *a, file=sys.stderr, flush=True)


# ------------------------------------------------------------------ /proc
def children_of(pid):
    out = []
    try:
        for tid in os.listdir(f"/proc/{pid}/task"):
            try:
                with open(f"/proc/{pid}/task/{tid}/children") as f:
                    out += [int(x) for x in f.read().split()]
            except OSError:
                pass
    except OSError:
        pass
    return out


def is_guard(pid):
    """Whether pid is a nodus primary's orphan guard (a fork of the primary named nodus-guard: not a worker)."""
    try:
        with open(f"/proc/{pid}/comm") as f:
            return f.read().strip() == "nodus-guard"
    except OSError:
        return False


def tree(pid):
    """pid and all its descendants."""
    todo, seen = [pid], []
    while todo:
        p = todo.pop()
        if p not in seen:
            seen.append(p)
            todo += children_of(p)
    return seen


def stat_fields(pid):
    """/proc/PID/stat after the command name (field 3 onwards), or None."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(") ", 1)[1].split()
    except (OSError, IndexError):
        return None


def alive(pid):
    f = stat_fields(pid)
    return f is not None and f[0] != "Z"


def start_time(pid):
    f = stat_fields(pid)
    return int(f[19]) if f else None


def cpu_ticks(pid):
    """utime + stime of all threads of PID."""
    f = stat_fields(pid)
    return int(f[11]) + int(f[12]) if f else 0


def user_sys_ticks(pid):
    """(utime, stime) of all threads of PID: the tick-sampled split of its CPU time between user space
    and the kernel."""
    f = stat_fields(pid)
    return (int(f[11]), int(f[12])) if f else (0, 0)


def ctx_switches(pid):
    """(voluntary, involuntary) context switches of all threads of PID: voluntary ones are sleeps
    (an empty epoll_wait), involuntary ones preemptions."""
    vol = invol = 0
    try:
        tids = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return 0, 0
    for tid in tids:
        try:
            with open(f"/proc/{pid}/task/{tid}/status") as f:
                for line in f:
                    if line.startswith("voluntary_ctxt_switches:"):
                        vol += int(line.split()[1])
                    elif line.startswith("nonvoluntary_ctxt_switches:"):
                        invol += int(line.split()[1])
        except (OSError, ValueError, IndexError):
            pass
    return vol, invol


def cpu_ns(pid):
    """Time on a CPU of all threads of PID in ns: the scheduler's own account
    (/proc/PID/task/TID/schedstat, first field), exact where utime + stime are 1/CLK_TCK samples of
    whoever runs at each tick (a primary running in ~10 µs bursts is sampled, not measured)."""
    total = 0
    try:
        tids = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return 0
    for tid in tids:
        try:
            with open(f"/proc/{pid}/task/{tid}/schedstat") as f:
                total += int(f.read().split()[0])
        except (OSError, ValueError, IndexError):
            pass
    return total


def cmdline(pid):
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return f.read().replace(b"\0", b" ").decode(errors="replace").strip()
    except OSError:
        return ""


def kill_same(pid, started, sig=signal.SIGKILL):
    """Signals pid only if it is still the process that started at `started` (no PID reuse)."""
    if alive(pid) and start_time(pid) == started:
        try:
            os.kill(pid, sig)
        except ProcessLookupError:
            pass


def wait_quiet(sample=0.5):
    """Waits (at most QUIET_MAX_WAIT s) until other load is under QUIET_PCT; returns
    (waited s, busy %, gave up)."""
    start = time.time()
    while True:
        a = sys_ticks()
        time.sleep(sample)
        busy = busy_pct(a, sys_ticks())
        waited = time.time() - start
        if busy < QUIET_PCT or waited > QUIET_MAX_WAIT:
            if waited > 2 * sample:
                log(f"   waited {waited:.0f} s for a quiet machine (busy {busy:.0f}%)")
            return round(waited, 1), round(busy, 1), busy >= QUIET_PCT


# ------------------------------------------------------------------ ports
next_port = port_picker(PORT_BASE, PORT_SPAN)


def connects(port):
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=0.5):
            return True
    except OSError:
        return False


# ------------------------------------------------------------------ events
def read_events(path):
    """The events of a JSON-lines file (a line being written is skipped), t_ns as int."""
    out = []
    try:
        with open(path) as f:
            for line in f:
                try:
                    e = json.loads(line)
                except ValueError:
                    continue
                e["t_ns"] = int(e["t_ns"])
                out.append(e)
    except OSError:
        pass
    return out


def serving(e):
    return e.get("event") in ("listening", "ready")


# ------------------------------------------------------------------ wrk
def parse_wrk(text):
    unit = {"us": 1e-3, "ms": 1.0, "s": 1e3, "m": 60e3}
    r = {}
    m = re.search(r"^\s*(\d+) requests in", text, re.M)
    r["requests"] = int(m.group(1)) if m else None
    m = re.search(r"Requests/sec:\s+([\d.]+)", text)
    r["rps"] = float(m.group(1)) if m else None
    for pct in ("50", "99"):
        m = re.search(rf"^\s+{pct}%\s+([\d.]+)(us|ms|s|m)\s*$", text, re.M)
        r[f"p{pct}_ms"] = float(m.group(1)) * unit[m.group(2)] if m else None
    m = re.search(r"Socket errors: connect (\d+), read (\d+), write (\d+), timeout (\d+)", text)
    c, rd, w, to = (int(x) for x in m.groups()) if m else (0, 0, 0, 0)
    m = re.search(r"Non-2xx or 3xx responses: (\d+)", text)
    r.update(err_connect=c, err_read=rd, err_write=w, err_timeout=to, non2xx=int(m.group(1)) if m else 0)
    r["errors"] = c + rd + w + to + r["non2xx"]
    return r


def run_wrk(path, port, conns, duration, close, latency=True):
    """One wrk run (bounded: killed by PID 20 s after its duration); its output goes to `path`."""
    argv = NICE + ["wrk", "-t1", f"-c{conns}", f"-d{duration}s", "--timeout", "2s"]
    argv += ["--latency"] if latency else []
    argv += ["-H", "Connection: close"] if close else []
    argv.append(f"http://127.0.0.1:{port}/")
    cmd = " ".join(shlex.quote(a) for a in argv)
    with open(path, "w") as f:
        f.write(f"$ {cmd}\n")
        f.flush()
        t0 = time.monotonic()
        p = subprocess.Popen(argv, stdout=f, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
        LIVE.append(p)
        deadline = t0 + duration + 20
        try:
            while True:
                pid, _, ru = os.wait4(p.pid, os.WNOHANG)
                if pid:
                    break
                if time.monotonic() > deadline:
                    log(f"   wrk overran; SIGKILL to pid {p.pid}")
                    os.kill(p.pid, signal.SIGKILL)
                    _, _, ru = os.wait4(p.pid, 0)
                    break
                time.sleep(0.05)
        finally:
            LIVE.remove(p)
        p.returncode = 0  # reaped by wait4
        wall = time.monotonic() - t0
    with open(path) as f:
        r = parse_wrk(f.read())
    r.update(wrk_cmd=cmd, wrk_wall_s=round(wall, 2), wrk_file=os.path.basename(path),
             wrk_cpu_pct=round(100.0 * (ru.ru_utime + ru.ru_stime) / wall, 1))
    return r


# ------------------------------------------------------------------ servers
class Unavailable(Exception):
    """A server that cannot run here (a binary or a flag is missing): its rows are skipped."""


def pm2(*args, port=None, timeout=60):
    """The pm2 CLI on our private PM2_HOME; PORT reaches the app through the daemon's environment."""
    env = dict(os.environ, PM2_HOME=PM2_HOME, FORCE_COLOR="0")
    env.pop("NODE_CLUSTER_SCHED_POLICY", None)
    if port:
        env["PORT"] = str(port)
    return subprocess.run(NICE + [PM2, *args], cwd=HERE, env=env, capture_output=True, text=True,
                          timeout=timeout)


def pm2_daemon():
    try:
        with open(os.path.join(PM2_HOME, "pm2.pid")) as f:
            pid = int(f.read().strip())
        return pid if alive(pid) else None
    except (OSError, ValueError):
        return None


def pm2_kill():
    """`pm2 kill` if our private daemon runs (any other pm2 command would start one), then SIGKILL by PID
    whatever of its tree is left."""
    daemon = pm2_daemon()
    if not daemon:
        return
    procs = [(p, start_time(p)) for p in tree(daemon)]
    try:
        pm2("kill", timeout=30)
    except subprocess.TimeoutExpired:
        log("   pm2 kill timed out")
    t_end = time.time() + 5
    while alive(daemon) and time.time() < t_end:
        time.sleep(0.1)
    for p, started in procs:
        if alive(p):
            log(f"   pm2 process {p} still alive after pm2 kill: SIGKILL")
            kill_same(p, started)


def command(cfg, args, port, events):
    """(argv, extra env) of a server; Unavailable when its binary is missing."""
    def need(path, how):
        if not path or not os.path.exists(path):
            raise Unavailable(f"{path} is missing ({how})")
        return path
    if cfg.kind == "nodus":
        exe = need(args.cluster, "cargo build --release -p nodus-http --example cluster")
        return [exe, "--workers", str(WORKERS), "--policy", cfg.policy, "--listen", f"127.0.0.1:{port}",
                "--events", events], {}
    if cfg.kind == "nodus-node":
        exe = need(args.nodus_cli, "cargo build --release -p nodus-cli")
        return [exe, "run", "-w", str(WORKERS), "--node", "--events", events, "--", "node", APP_JS], {}
    if cfg.kind == "nodus-single":
        return [need(args.hello_http, "cargo build --release -p nodus-http --example hello_http"), str(port)], {}
    if cfg.kind == "node":
        return ["node", PRIMARY_JS], {"WORKERS": str(WORKERS), "EVENTS": events,
                                      "NODE_CLUSTER_SCHED_POLICY": cfg.policy}
    if cfg.kind == "node-single":
        return ["node", APP_JS], {}
    if cfg.kind == "floor":
        exe = need(args.handoff_floor, "gcc -O2 -o target/handoff_floor bench/cluster/handoff_floor.c")
        return [exe, str(port), cfg.policy], {}
    raise ValueError(cfg.kind)


class Server:
    """One server start: the process we start (or PM2's daemon) is the root, its workers are its children."""

    def __init__(self, cfg, args, tag):
        self.cfg, self.port, self.p = cfg, next_port(), None
        self.events = os.path.join(args.outdir, f"events-{tag}.jsonl") if cfg.kind in EVENT_KINDS else None
        self.expected = 1 if one_process(cfg) else 1 + WORKERS
        self.log_path = os.path.join(args.outdir, f"server-{tag}.log")
        if cfg.kind == "pm2":
            if not os.path.exists(PM2):
                raise Unavailable(f"{PM2} is missing (cd bench/node && npm ci)")
            self.cmd = f"PM2_HOME={PM2_HOME} PORT={self.port} pm2 start {APP_JS} -i {WORKERS} --name {PM2_APP}"
            pm2_kill()  # a fresh daemon for every start
            r = pm2("start", APP_JS, "-i", str(WORKERS), "--name", PM2_APP, port=self.port)
            with open(self.log_path, "w") as f:
                f.write(f"$ {self.cmd}\n{r.stdout}{r.stderr}")
            self.root = pm2_daemon()
            LIVE.append(self)
            if r.returncode != 0 or not self.root:
                self.stop()
                raise RuntimeError(f"pm2 start failed (rc {r.returncode}): {r.stderr[-300:]}")
        else:
            if self.events:
                open(self.events, "w").close()
            argv, extra = command(cfg, args, self.port, self.events)
            env = dict(os.environ, PORT=str(self.port), **extra)
            if "NODE_CLUSTER_SCHED_POLICY" not in extra:
                env.pop("NODE_CLUSTER_SCHED_POLICY", None)
            self.cmd = " ".join([f"{k}={shlex.quote(v)}" for k, v in sorted(extra.items())] + [f"PORT={self.port}"] +
                                [shlex.quote(a) for a in NICE + argv])
            with open(self.log_path, "w") as f:
                f.write(f"$ {self.cmd}\n")
                f.flush()
                self.p = subprocess.Popen(NICE + argv, cwd=HERE, env=env, stdout=f, stderr=subprocess.STDOUT,
                                          stdin=subprocess.DEVNULL, start_new_session=True)
            self.root = self.p.pid
            LIVE.append(self)
        self.wait_ready()
        self.ready_at = time.monotonic()

    def wait_ready(self, timeout=20.0):
        """The port answers, the workers exist and (with events) every slot reported listening or ready."""
        t_end = time.monotonic() + timeout
        while time.monotonic() < t_end:
            if self.p and self.p.poll() is not None:
                rc = self.p.returncode
                self.stop()
                out = open(self.log_path).read().splitlines()[1:]  # after the command line
                last = next((l.strip() for l in reversed(out) if l.strip()), "no output")
                raise (Unavailable if self.cfg.kind in NODUS_KINDS else RuntimeError)(
                    f"exited with code {rc} before serving (last output: {last[:200]}): {self.cmd}")
            slots = {e.get("worker") for e in read_events(self.events) if serving(e)} if self.events else set()
            if (connects(self.port) and len(self.pids()) >= self.expected
                    and (not self.events or len(slots) >= WORKERS)):
                time.sleep(0.3)
                return
            time.sleep(0.05)
        self.stop()
        raise (Unavailable if self.cfg.kind in NODUS_KINDS else RuntimeError)(
            f"not serving {self.expected} process(es) with {WORKERS} listening slots within {timeout:.0f} s: "
            f"{self.cmd}")

    def pids(self):
        return tree(self.root) if self.root else []

    def workers(self):
        return sorted(p for p in self.pids() if p != self.root and not is_guard(p))

    def stop(self):
        """SIGTERM to the root (SIGKILL after 5 s), then SIGKILL to its process group and to any process of
        its tree left (by PID, checked against its start time). PM2: `pm2 kill`, then the same by PID."""
        if self not in LIVE:
            return
        LIVE.remove(self)
        if self.cfg.kind == "pm2":
            pm2_kill()
        else:
            procs = [(p, start_time(p)) for p in self.pids()]
            if self.p.poll() is None:
                self.p.send_signal(signal.SIGTERM)
                try:
                    self.p.wait(timeout=5)
                except subprocess.TimeoutExpired:
                    log(f"   {self.cfg.key}: no exit 5 s after SIGTERM; SIGKILL")
            try:
                os.killpg(self.p.pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
            self.p.wait()
            for p, started in procs:
                kill_same(p, started)
        t_end = time.time() + 5
        while not port_free(self.port) and time.time() < t_end:
            time.sleep(0.1)


def stop_all():
    for x in list(LIVE):
        try:
            if isinstance(x, Server):
                x.stop()
            else:
                x.kill()
                x.wait()
                LIVE.remove(x)
        except Exception as e:  # keep stopping the others
            log(f"   while stopping {x}: {e}")


# ------------------------------------------------------------------ measures
def measure_memory(srv, args, tag):
    time.sleep(max(0.0, args.settle - (time.monotonic() - srv.ready_at)))
    procs = [{"pid": p, "root": p == srv.root, "cmd": cmdline(p)[:100], "rss_kb": proc_kb(p, "VmRSS"),
              "pss_kb": proc_kb(p, "Pss", "smaps_rollup")} for p in srv.pids()]
    r = dict(procs=procs, settle_s=args.settle, rss_mb=round(sum(p["rss_kb"] for p in procs) / 1024, 1),
             pss_mb=round(sum(p["pss_kb"] for p in procs) / 1024, 1))
    log(f"   memory: PSS {r['pss_mb']} MB, RSS {r['rss_mb']} MB, {len(procs)} processes")
    return [r]


def measure_load(srv, args, tag, close):
    """Warm-up, then one measured wrk run; a run disturbed by foreign load is repeated (at most twice)."""
    name = "close" if close else "keepalive"
    conns = args.conns_close if close else args.conns_keepalive
    warmup = args.warmup_close if close else args.warmup_keepalive
    run_wrk(os.path.join(args.outdir, f"wrk-warmup-{name}-{tag}.txt"), srv.port, conns, warmup, close, False)
    for attempt in range(1, 4):
        waited, busy_before, gave_up = wait_quiet()
        pids = srv.pids()
        c0, t0, s0 = {p: cpu_ns(p) for p in pids}, {p: cpu_ticks(p) for p in pids}, sys_ticks()
        u0, x0 = {p: user_sys_ticks(p) for p in pids}, {p: ctx_switches(p) for p in pids}
        r = run_wrk(os.path.join(args.outdir, f"wrk-{name}-{tag}-a{attempt}.txt"), srv.port, conns, args.duration,
                    close)
        c1, t1, s1 = {p: cpu_ns(p) for p in pids}, {p: cpu_ticks(p) for p in pids}, sys_ticks()
        u1, x1 = {p: user_sys_ticks(p) for p in pids}, {p: ctx_switches(p) for p in pids}
        user_ticks, sys_ticks_ = (sum(u1[p][i] - u0[p][i] for p in pids) for i in (0, 1))
        sleeps, preempted = (sum(x1[p][i] - x0[p][i] for p in pids) for i in (0, 1))
        wall = r["wrk_wall_s"]
        cpu_s = {p: (c1[p] - c0[p]) / 1e9 for p in pids}
        total, root = sum(cpu_s.values()), cpu_s.get(srv.root, 0.0)
        ticks_total = sum(t1[p] - t0[p] for p in pids) / CLK_TCK
        machine = busy_pct(s0, s1)
        r.update(attempt=attempt, conns=conns, duration=args.duration, quiet_wait_s=waited,
                 busy_before_pct=busy_before, gate_gave_up=gave_up,
                 server_cpu_pct=round(100 * total / wall, 1), root_cpu_pct=round(100 * root / wall, 1),
                 worker_cpu_pct=[round(100 * cpu_s[p] / wall, 1) for p in pids if p != srv.root and not is_guard(p)],
                 machine_busy_pct=round(machine, 1), processes=len(pids),
                 alive_after=all(alive(p) for p in pids))
        r["foreign_cpu_pct"] = round(max(0.0, machine - r["server_cpu_pct"] - r["wrk_cpu_pct"]), 1)
        if r["requests"] and total:
            r["req_per_cpu_s"] = round(r["requests"] / total)
            # The older, sampled account (utime + stime), kept in results.json for comparison.
            r["cpu_us_per_req_ticks"] = round(1e6 * ticks_total / r["requests"], 1)
            r["cpu_us_per_req"] = round(1e6 * total / r["requests"], 1)
            r["root_us_per_req"] = round(1e6 * root / r["requests"], 1)
            r["workers_us_per_req"] = round(1e6 * (total - root) / r["requests"], 1)
            # Where a request's CPU goes: the exact total split by the sampled user/kernel share.
            if user_ticks + sys_ticks_:
                r["user_share"] = round(user_ticks / (user_ticks + sys_ticks_), 3)
                r["user_us_per_req"] = round(r["cpu_us_per_req"] * r["user_share"], 2)
                r["kernel_us_per_req"] = round(r["cpu_us_per_req"] - r["user_us_per_req"], 2)
            r["sleeps_per_req"] = round(sleeps / r["requests"], 4)
            r["preemptions_per_req"] = round(preempted / r["requests"], 4)
        log(f"   {name}: {r['rps'] or 0:,.0f} req/s, server CPU {r['server_cpu_pct']}% (primary {r['root_cpu_pct']}%,"
            f" workers {r['worker_cpu_pct']}), {r.get('cpu_us_per_req')} µs/req, {r.get('req_per_cpu_s') or 0:,} "
            f"req/CPU-s, wrk {r['wrk_cpu_pct']}%, errors {r['errors']}, foreign {r['foreign_cpu_pct']}%")
        if r["foreign_cpu_pct"] <= QUIET_PCT or r["gate_gave_up"]:
            return [r]
        log(f"   disturbed (foreign CPU {r['foreign_cpu_pct']}%), again")
    return [r]


def measure_reload(srv, args, tag):
    olds = srv.workers()
    waited = wait_quiet()[0]
    if srv.cfg.kind == "pm2":
        t0 = time.monotonic_ns()
        out = pm2("reload", PM2_APP, port=srv.port)
        r = {"cli_ms": round((time.monotonic_ns() - t0) / 1e6, 1), "rc": out.returncode}
        r["reload_ms"] = r["cli_ms"]
    else:
        n0 = len(read_events(srv.events))
        t_hup = time.monotonic_ns()
        os.kill(srv.root, signal.SIGHUP)
        done, t_end = None, time.monotonic() + 30
        while done is None and time.monotonic() < t_end:
            evs = read_events(srv.events)[n0:]
            done = next((e for e in evs if e["event"] in ("reload_done", "reload_failed")), None)
            time.sleep(0.005)
        start = next((e for e in read_events(srv.events)[n0:] if e["event"] == "reload_start"), None)
        r = {"outcome": done["event"] if done else "timeout (30 s)"}
        if done and done["event"] == "reload_done":
            r["reload_ms"] = r["hup_to_done_ms"] = round((done["t_ns"] - t_hup) / 1e6, 1)
            if start:
                r["start_to_done_ms"] = round((done["t_ns"] - start["t_ns"]) / 1e6, 1)
    t_end = time.monotonic() + 5  # the old workers' exits may trail the reload's end
    while time.monotonic() < t_end and (set(olds) & set(srv.workers()) or len(srv.workers()) != WORKERS):
        time.sleep(0.02)
    news = srv.workers()
    r.update(quiet_wait_s=waited, replaced=not (set(olds) & set(news)) and len(news) == WORKERS,
             workers_before=olds, workers_after=news)
    log(f"   reload: {r.get('reload_ms')} ms ({r.get('outcome', 'pm2 reload rc ' + str(r.get('rc')))}; "
        f"reload_start → done {r.get('start_to_done_ms')} ms), workers replaced: {r['replaced']}")
    return [r]


def slot_pids(events):
    """{slot: pid} of the latest serving worker of each slot."""
    out = {}
    for e in events:
        if serving(e) and "worker" in e:
            out[e["worker"]] = e["pid"]
    return out


def measure_kill9(srv, args, tag):
    out = []
    wait_quiet()
    for k in range(args.kills):
        evs = read_events(srv.events)
        slots = slot_pids(evs)
        if not slots:
            log("   kill9: no listening/ready event names a worker slot; no kills")
            break
        slot = sorted(slots, key=str)[k % len(slots)]
        victim, n0 = slots[slot], len(evs)
        if not alive(victim):
            log(f"   kill9: the worker of slot {slot} (pid {victim}) is gone already; stopping")
            break
        t_kill = time.monotonic_ns()
        os.kill(victim, signal.SIGKILL)
        r, t_end = {"kill": k + 1, "slot": slot, "victim": victim}, time.monotonic() + 10
        while time.monotonic() < t_end:
            new = read_events(srv.events)[n0:]
            up = next((e for e in new if serving(e) and e.get("worker") == slot and e["pid"] != victim), None)
            if up or any(e["event"] == "give_up" for e in new) or srv.p.poll() is not None:
                break
            time.sleep(0.005)
        new = read_events(srv.events)[n0:]
        first = lambda pred: next((round((e["t_ns"] - t_kill) / 1e6, 2) for e in new if pred(e)), None)
        r.update(kill_to_exit_ms=first(lambda e: e["event"] == "exit" and e["pid"] == victim),
                 kill_to_fork_ms=first(lambda e: e["event"] == "fork" and e.get("worker") == slot),
                 kill_to_listening_ms=first(lambda e: serving(e) and e.get("worker") == slot and e["pid"] != victim),
                 gave_up=any(e["event"] == "give_up" for e in new), primary_exit=srv.p.poll())
        out.append(r)
        log(f"   kill9 {k + 1}: slot {slot} → serving again after {r['kill_to_listening_ms']} ms "
            f"(exit seen {r['kill_to_exit_ms']}, fork {r['kill_to_fork_ms']})")
        if r["kill_to_listening_ms"] is None:
            log(f"   kill9: no replacement within 10 s (give_up event: {r['gave_up']}, primary exit code: "
                f"{r['primary_exit']}); no more kills on this start")
            break
        time.sleep(KILL_GAP)
    return out


MEASURES = {"memory": measure_memory, "close": lambda s, a, t: measure_load(s, a, t, True),
            "keepalive": lambda s, a, t: measure_load(s, a, t, False), "reload": measure_reload,
            "kill9": measure_kill9}


def run(args, results, skipped, failures, flush):
    configs = [c for c in CONFIGS if c.key in args.configs]
    for rnd in range(1, args.rounds + 1):
        for cfg in configs if rnd % 2 else configs[::-1]:  # alternate the order between rounds
            if cfg.key in skipped:
                continue
            measures = [m for m in MEASURE_ORDER if m in cfg.measures and m in args.measures]
            if not measures:
                continue
            tag = f"{cfg.key}-r{rnd}"
            log(f"[r{rnd}] {cfg.label}")
            try:
                srv = Server(cfg, args, tag)
            except Unavailable as e:
                skipped[cfg.key] = str(e)
                log(f"   SKIPPED for this run: {e}")
                continue
            except Exception as e:
                failures.append({"config": cfg.key, "round": rnd, "error": str(e)})
                log(f"   FAILED to start: {e}")
                continue
            try:
                for m in measures:
                    for r in MEASURES[m](srv, args, tag):
                        r.update(config=cfg.key, measure=m, round=rnd, server_cmd=srv.cmd)
                        results.append(r)
                    flush()
            except Exception as e:
                failures.append({"config": cfg.key, "round": rnd, "error": repr(e)})
                log(f"   FAILED: {traceback.format_exc()}")
            finally:
                srv.stop()
            flush()


# ------------------------------------------------------------------ report
def mmm(xs, f="{:,.0f}"):
    """median (min–max) of the values that exist."""
    xs = [x for x in xs if x is not None]
    if not xs:
        return "–"
    s = f.format(statistics.median(xs))
    return s + (f" ({f.format(min(xs))}–{f.format(max(xs))})" if len(xs) > 1 else "")


def values(rs, cfg, measure, metric):
    return [r.get(metric) for r in rs if r["config"] == cfg and r["measure"] == measure]


def per_round(rs, cfg, measure, metric):
    """{round: median of metric}."""
    return median_by_round(rs, metric, config=cfg, measure=measure)


def round_pairs(rs, a, b, measure, metric, op):
    """op(a, b) per round for configs a and b, over the rounds where both exist."""
    ra, rb = per_round(rs, a, measure, metric), per_round(rs, b, measure, metric)
    return [op(ra[k], rb[k]) for k in ra if k in rb and rb[k] is not None]


NODUS_WORKER_CONFIGS = ("nodus-rr", "nodus-shared", "nodus-reuseport", "nodus-least")


def verdicts(rs, xs_of, fmt, ok):
    """'rr 2.31× yes; shared …' over the nodus-worker configs that have data."""
    parts = []
    for c in NODUS_WORKER_CONFIGS:
        xs = xs_of(c)
        if xs:
            v = med(xs)
            parts.append(f"{c[6:]} {fmt.format(v)} {'yes' if ok(v) else '**no**'}")
    return "; ".join(parts) or "no nodus data"


def floor_note(rs):
    """The bare C handoff's own price beside the rr verdict: floor-rr over floor-one, per round, median."""
    xs = round_pairs(rs, "floor-rr", "floor-one", "close", "cpu_us_per_req", lambda a, b: a - b)
    return f"; the bare C handoff (`handoff_floor.c`) {med(xs):+.1f} µs over its own 1 process" if xs else ""


def summary(rs, present):
    ratio = lambda a, b: a / b
    diff = lambda a, b: a - b
    rows = [
        ("keep-alive requests per server CPU-second", "keepalive", "req_per_cpu_s", "{:,.0f}",
         "≥ 2× Node rr [Node cluster 96k]",
         verdicts(rs, lambda c: round_pairs(rs, c, "node-rr", "keepalive", "req_per_cpu_s", ratio), "{:.2f}×",
                  lambda v: v >= 2)),
        ("new connections (`Connection: close`, wrk -c32): server CPU µs per connection", "close", "cpu_us_per_req",
         "{:,.1f}", "rr within 10 µs of nodus 1 process [Node rr 108, none 47; PM2 144]",
         verdicts(rs, lambda c: round_pairs(rs, c, "nodus-single", "close", "cpu_us_per_req", diff), "{:+.1f} µs",
                  lambda v: v <= 10) + floor_note(rs)),
        ("new connections per second, same run", "close", "rps", "{:,.0f}",
         "≥ 2× Node rr [Node rr 13.7k, none 21.6k; PM2 9.1k]",
         verdicts(rs, lambda c: round_pairs(rs, c, "node-rr", "close", "rps", ratio), "{:.2f}×", lambda v: v >= 2)),
        ("kill -9 → replacement listening, ms", "kill9", "kill_to_listening_ms", "{:,.1f}", "≤ 10 ms [Node 75]",
         verdicts(rs, lambda c: values(rs, c, "kill9", "kill_to_listening_ms"), "{:.1f} ms", lambda v: v <= 10)),
        ("rolling reload of 2 idle workers, ms (SIGHUP → reload_done; PM2: `pm2 reload` wall time)", "reload",
         "reload_ms", "{:,.0f}", "≤ 50 ms [Node recipe 152, PM2 567]",
         verdicts(rs, lambda c: values(rs, c, "reload", "reload_ms"), "{:.0f} ms", lambda v: v <= 50)),
        ("idle memory, primary + 2 workers: PSS sum, MB", "memory", "pss_mb", "{:,.1f}",
         "≤ 10 MB PSS [Node 56, PM2 82]",
         verdicts(rs, lambda c: values(rs, c, "memory", "pss_mb"), "{:.1f} MB", lambda v: v <= 10)),
        ("idle memory: RSS sum, MB", "memory", "rss_mb", "{:,.1f}", "[Node 129, PM2 165]", ""),
    ]
    out = ["| measure | " + " | ".join(c.label for c in present) + " | target [issue's anchor] | met? |",
           "|---|" + "---|" * (len(present) + 2)]
    for label, measure, metric, f, target, verdict in rows:
        cells = [mmm(values(rs, c.key, measure, metric), f) for c in present]
        out.append(f"| {label} | " + " | ".join(cells) + f" | {target} | {verdict} |")
    return out


def load_table(rs, present, measure):
    head = ["| server | req/s | server CPU % | primary CPU % | workers CPU % (each) | µs per request: total "
           "(primary + workers) | req per server CPU-s | wrk CPU % | p50 / p99 ms | errors (per run) | foreign CPU % |",
           "|---|---|---|---|---|---|---|---|---|---|---|"]
    out = []
    for c in present:
        mine = [r for r in rs if r["config"] == c.key and r["measure"] == measure]
        if not mine:
            continue
        v = lambda m, f="{:,.0f}": mmm([r.get(m) for r in mine], f)
        us = v("cpu_us_per_req", "{:.1f}")
        if one_process(c):
            primary = each = "–"
        else:
            primary = v("root_cpu_pct")
            each = "; ".join(" / ".join(f"{x:.0f}" for x in r["worker_cpu_pct"]) for r in mine)
            us += f" ({med([r.get('root_us_per_req') for r in mine]) or 0:.1f} + " \
                  f"{med([r.get('workers_us_per_req') for r in mine]) or 0:.1f})"
        out.append(f"| {c.label} | {v('rps')} | {v('server_cpu_pct')} | {primary} | {each} | {us} "
                   f"| {v('req_per_cpu_s')} | {v('wrk_cpu_pct')} | {v('p50_ms', '{:.2f}')} / {v('p99_ms', '{:.2f}')} "
                   f"| {', '.join(str(r['errors']) for r in mine)} | {v('foreign_cpu_pct')} |")
    return head + out if out else []


def split_table(rs, present, measure):
    """Where a request's server CPU goes: user space against the kernel (the exact schedstat total split
    by the tick-sampled utime/stime share), and how often the servers slept or were preempted."""
    head = ["| server | µs per request | user space µs | kernel µs | user share | sleeps per request "
            "| preemptions per request |", "|---|---|---|---|---|---|---|"]
    out = []
    for c in present:
        mine = [r for r in rs if r["config"] == c.key and r["measure"] == measure and "user_share" in r]
        if mine:
            v = lambda m, f: mmm([r.get(m) for r in mine], f)
            out.append(f"| {c.label} | {v('cpu_us_per_req', '{:.1f}')} | {v('user_us_per_req', '{:.2f}')} "
                       f"| {v('kernel_us_per_req', '{:.2f}')} | {v('user_share', '{:.2f}')} "
                       f"| {v('sleeps_per_req', '{:.3f}')} | {v('preemptions_per_req', '{:.3f}')} |")
    return head + out if out else []


def kill9_table(rs, present):
    out = []
    for c in present:
        ks = [r for r in rs if r["config"] == c.key and r["measure"] == "kill9"]
        if ks:
            v = lambda m: mmm([r.get(m) for r in ks], "{:.1f}")
            missing = sum(1 for r in ks if r.get("kill_to_listening_ms") is None)
            out.append(f"| {c.label} | {v('kill_to_listening_ms')} | {v('kill_to_exit_ms')} | {v('kill_to_fork_ms')} "
                       f"| {len(ks)} ({missing}) |")
    return ["| server | kill → serving again, ms | kill → exit seen, ms | kill → fork, ms "
            "| kills (without a replacement) |", "|---|---|---|---|---|"] + out if out else []


def reload_table(rs, present):
    out = []
    for c in present:
        rl = [r for r in rs if r["config"] == c.key and r["measure"] == "reload"]
        if rl:
            out.append(f"| {c.label} | {mmm([r.get('reload_ms') for r in rl])} "
                       f"| {mmm([r.get('start_to_done_ms') for r in rl])} "
                       f"| {', '.join('yes' if r['replaced'] else 'no: ' + str(r.get('outcome', '')) for r in rl)} |")
    return ["| server | SIGHUP → reload_done, ms (PM2: CLI wall time) | reload_start → reload_done, ms "
            "| all workers replaced (per run) |", "|---|---|---|---|"] + out if out else []


def memory_table(rs, present):
    out = []
    for c in present:
        mm = [r for r in rs if r["config"] == c.key and r["measure"] == "memory"]
        if mm:
            n = max(len(r["procs"]) for r in mm)
            per = [med([sorted(r["procs"], key=lambda p: not p["root"])[i]["rss_kb"] / 1024
                        for r in mm if len(r["procs"]) > i]) for i in range(n)]
            out.append(f"| {c.label} | {mmm([r['pss_mb'] for r in mm], '{:.1f}')} "
                       f"| {mmm([r['rss_mb'] for r in mm], '{:.1f}')} | {n} | {' + '.join(f'{x:.1f}' for x in per)} |")
    return ["| server | PSS sum, MB | RSS sum, MB | processes | RSS per process, MB (primary first; median) |",
            "|---|---|---|---|---|"] + out if out else []


def report(doc):
    rs, skipped, failures = doc["results"], doc.get("skipped", {}), doc.get("failures", [])
    present = [c for c in CONFIGS if any(r["config"] == c.key for r in rs)]
    rounds = len({r["round"] for r in rs})
    loads = [r for r in rs if r["measure"] in ("close", "keepalive")]
    if not rs:
        out = ["(no results)"]
    else:
        out = [f"Medians (min–max) over {rounds} interleaved round(s); 2 workers; ratios and differences are "
               "taken within a round, then the median. Nothing pinned; 127.0.0.1.", ""] + summary(rs, present)
    for title, table in (
            ("New connections: `wrk -t1 -c32 -H 'Connection: close'` (one request per connection)",
             load_table(rs, present, "close")),
            ("Keep-alive: `wrk -t1 -c64`", load_table(rs, present, "keepalive")),
            ("Keep-alive: where a request's server CPU goes", split_table(rs, present, "keepalive")),
            ("kill -9 of an idle worker → its slot serves again", kill9_table(rs, present)),
            ("Rolling reload of 2 idle workers", reload_table(rs, present)),
            ("Idle memory", memory_table(rs, present))):
        if table:
            out += ["", f"#### {title}", ""] + table
    if loads:
        foreign = [r["foreign_cpu_pct"] for r in loads]
        out += ["", f"Noise: foreign CPU during the kept load runs: median {med(foreign):.0f}%, highest "
                f"{max(foreign):.0f}% of a core; {sum(1 for r in loads if r['attempt'] > 1)} run(s) repeated; "
                f"{sum(1 for r in loads if r['gate_gave_up'])} run(s) after the quiet gate gave up."]
    for k, why in skipped.items():
        out.append(f"\nSkipped: {k}: {why}")
    for f in failures:
        out.append(f"\nFailed: {f['config']} round {f['round']}: {f['error'][:300]}")
    return "\n".join(out)


# ------------------------------------------------------------------ main
def sh(cmd, cwd=REPO):
    p = subprocess.run(cmd, shell=True, capture_output=True, text=True, cwd=cwd)
    return ((p.stdout.strip() or p.stderr.strip()).splitlines() or ["?"])[0]


def environment(args):
    model = next((l.split(":", 1)[1].strip() for l in open("/proc/cpuinfo") if l.startswith("model name")), "?")
    mem_kb = next((int(l.split()[1]) for l in open("/proc/meminfo") if l.startswith("MemTotal")), 0)
    pm2_pkg = os.path.join(BENCH, "node", "node_modules", "pm2", "package.json")
    binaries = {}
    for name in ("cluster", "nodus_cli", "hello_http"):
        path = getattr(args, name)
        binaries[name] = (f"{path} (built {time.strftime('%Y-%m-%d %H:%M', time.localtime(os.path.getmtime(path)))})"
                          if path and os.path.exists(path) else f"{path}: missing")
    return {
        "machine": f"nproc={os.cpu_count()}; {model}; {mem_kb / 2**20:.0f} GiB RAM; kernel {os.uname().release}",
        "node": sh("node --version"), "wrk": sh("wrk -v 2>&1 | head -1"),
        "pm2": json.load(open(pm2_pkg))["version"] if os.path.exists(pm2_pkg) else "missing",
        "commit": sh("git log -1 --format='%H %s'"), "binaries": binaries,
        "command": " ".join(shlex.quote(a) for a in sys.argv), "rounds": args.rounds,
        "wrk_settings": f"-t1 --timeout 2s; close: -c{args.conns_close} -H 'Connection: close', warm-up "
                        f"{args.warmup_close} s; keep-alive: -c{args.conns_keepalive}, warm-up "
                        f"{args.warmup_keepalive} s; {args.duration} s measured",
        "idle": f"memory after {args.settle} s; {args.kills} kill(s) per start, {KILL_GAP} s apart",
        "quiet_gate": f"wait until other load < {QUIET_PCT:.0f}% of a core, at most {QUIET_MAX_WAIT:g} s",
        "nice": args.nice,
    }


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    target = os.path.join(REPO, "target", "release")
    ap.add_argument("--cluster", default=os.path.join(target, "examples", "cluster"),
                    help="the nodus cluster example (nodus-* rows)")
    ap.add_argument("--nodus-cli", default=os.path.join(target, "nodus"), help="the nodus binary (nodus-node row)")
    ap.add_argument("--hello-http", default=os.path.join(target, "examples", "hello_http"),
                    help="the one-process nodus server (nodus-single row)")
    ap.add_argument("--handoff-floor", default=os.path.join(REPO, "target", "handoff_floor"),
                    help="bench/cluster/handoff_floor.c built (floor-* rows)")
    ap.add_argument("--rounds", type=int, help="interleaved rounds (default 3; --quick: 1)")
    ap.add_argument("--quick", action="store_true",
                    help="a smoke run, not for claims: 1 round, wrk 3 s after 1 s of warm-up, 2 s settle, 2 kills")
    ap.add_argument("--duration", type=int, default=10, help="seconds of each measured wrk run")
    ap.add_argument("--warmup-close", type=int, default=2)
    ap.add_argument("--warmup-keepalive", type=int, default=3)
    ap.add_argument("--conns-close", type=int, default=32)
    ap.add_argument("--conns-keepalive", type=int, default=64)
    ap.add_argument("--settle", type=float, default=5.0, help="seconds idle before the memory is read")
    ap.add_argument("--kills", type=int, default=4, help="kill -9 per server start (slots in turn)")
    ap.add_argument("--configs", default=",".join(c.key for c in CONFIGS), help="servers to run (comma-separated)")
    ap.add_argument("--measures", default=",".join(MEASURE_ORDER), help="measures to run (comma-separated)")
    ap.add_argument("--quiet-max-wait", type=float, default=60, help="most seconds to wait for a quiet machine")
    ap.add_argument("--nice", type=int, default=0, help="run servers, wrk and pm2 under `nice -n N`")
    ap.add_argument("--report", help="only print the tables of an existing results.json")
    args = ap.parse_args()
    if args.report:
        print(report(json.load(open(args.report))))
        return
    args.configs, args.measures = args.configs.split(","), args.measures.split(",")
    bad = [c for c in args.configs if c not in {c.key for c in CONFIGS}] + \
          [m for m in args.measures if m not in MEASURE_ORDER]
    if bad:
        ap.error(f"unknown server(s) or measure(s): {','.join(bad)}")
    if args.quick:
        args.rounds, args.duration, args.warmup_close, args.warmup_keepalive = args.rounds or 1, 3, 1, 1
        args.settle, args.kills = 2.0, 2
    args.rounds = args.rounds or 3
    globals()["QUIET_MAX_WAIT"] = args.quiet_max_wait
    if args.nice:
        NICE[:] = ["nice", "-n", str(args.nice)]
    stamp = _dt.datetime.now().strftime("%Y%m%d-%H%M%S")
    results_dir = os.path.join(BENCH, "results")
    args.outdir = os.path.join(results_dir, f"cluster-{stamp}")
    os.makedirs(args.outdir)
    doc = {"environment": environment(args), "results": [], "skipped": {}, "failures": []}

    def flush():
        with open(os.path.join(args.outdir, "results.json"), "w") as f:
            json.dump(doc, f, indent=1)

    def on_signal(sig, _frame):
        raise SystemExit(128 + sig)

    signal.signal(signal.SIGINT, signal.default_int_handler)  # even when started with SIGINT ignored
    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGHUP, on_signal)
    log("environment: " + json.dumps(doc["environment"], indent=1))
    t0 = time.time()
    try:
        pm2_kill()  # a daemon left by an interrupted run
        run(args, doc["results"], doc["skipped"], doc["failures"], flush)
    finally:
        stop_all()
        pm2_kill()
        doc["environment"]["minutes"] = round((time.time() - t0) / 60, 1)
        flush()
    env = doc["environment"]
    text = "\n".join(f"- {k}: {v}" for k, v in env.items() if k != "binaries")
    text += "\n" + "\n".join(f"- binary {k}: {v}" for k, v in env["binaries"].items())
    text += "\n\n" + report(doc) + "\n"
    with open(os.path.join(results_dir, f"cluster-{stamp}.md"), "w") as f:
        f.write(text)
    print(text)
    log(f"results in {args.outdir} and {results_dir}/cluster-{stamp}.md")


if __name__ == "__main__":
    main()
