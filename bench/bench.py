#!/usr/bin/env python3
"""nodus side-by-side benchmarks: runs nodus (default features, and with `measure` compiled out),
Node and tokio in the same interleaved rounds on this machine and prints medians and ratios.
Stdlib only (python3 >= 3.8). Normally started by bench/run.sh, which builds the binaries.

Usage:
  python3 bench/bench.py --nodus BIN --nodus-nomeasure BIN [--rounds 5] [--quick] [--only micro]
  python3 bench/bench.py --report bench/results/STAMP/results.json      (re-print the tables)

Each run is one process that prints one JSON line (see crates/nodus/benches/micro.rs and the peers
in bench/node/micro.js and bench/rust/src/bin/rt_micro.rs). Before every run the harness waits
(bounded) until the rest of the machine is quiet; a run disturbed by more than QUIET_PCT of foreign
CPU is repeated (at most twice). Ratios are taken within a round, then the median over rounds.
Results go to bench/results/<stamp>/ (results.json, summary.md). Sections: only `micro` so far;
an HTTP section (wrk against Node and hyper) is meant to be added next to it in SECTIONS.
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
QUIET_MAX_WAIT = 60  # s, per run
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
            p = subprocess.run(argv, cwd=HERE, capture_output=True, text=True, timeout=RUN_TIMEOUT)
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
        r.update(runtime=rt, name=bench, cmd=" ".join(shlex.quote(a) for a in argv), attempt=attempt,
                 quiet_wait_s=waited, busy_before_pct=busy_before,
                 foreign_cpu_pct=round(max(0.0, busy_pct(s0, s1) - own), 1))
        if r["foreign_cpu_pct"] <= QUIET_PCT:
            return r
        log(f"  {rt}/{bench}: disturbed (foreign CPU {r['foreign_cpu_pct']}%), again")
    return r


def micro_section(args, results, flush):
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


SECTIONS = {"micro": micro_section}


# ------------------------------------------------------------------ report
def med(xs):
    xs = [x for x in xs if x is not None]
    return statistics.median(xs) if xs else None


def fmt(v, metric):
    if v is None:
        return "–"
    return f"{v:,.0f}" if abs(v) >= 100 or metric == "lag_ms" and abs(v) >= 10 else f"{v:,.1f}"


def report(results):
    micro = [r for r in results if r.get("kind") == "micro"]
    if not micro:
        return "(no results)"
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


# ------------------------------------------------------------------ environment
def sh(cmd):
    p = subprocess.run(cmd, shell=True, capture_output=True, text=True, cwd=REPO)
    return (p.stdout.strip() or p.stderr.strip()).splitlines()[0] if (p.stdout or p.stderr) else "?"


def environment(args):
    model = next((l.split(":", 1)[1].strip() for l in open("/proc/cpuinfo") if l.startswith("model name")), "?")
    mem_kb = next((int(l.split()[1]) for l in open("/proc/meminfo") if l.startswith("MemTotal")), 0)
    lock = open(os.path.join(HERE, "rust", "Cargo.lock")).read()
    tokio = lock.split('name = "tokio"\nversion = "', 1)[1].split('"', 1)[0] if 'name = "tokio"' in lock else "?"
    dirty = subprocess.run(["git", "status", "--porcelain", "--", "crates"], cwd=REPO, capture_output=True,
                           text=True).stdout.strip()
    return {
        "machine": f"nproc={os.cpu_count()}; {model}; {mem_kb / 2**20:.0f} GiB RAM; kernel {os.uname().release}",
        "node": sh("node --version"), "rustc": sh("rustc --version"), "tokio": tokio,
        "nodus_commit": sh("git log -1 --format='%h %s'") + (" + uncommitted changes in crates/" if dirty else ""),
        "builds": {
            "nodus": f"{args.nodus}: cargo bench profile (= release: opt-level 3, lto fat, codegen-units 1), "
                     "default features [measure]",
            "nodus-nomeasure": f"{args.nodus_nomeasure}: same profile, --no-default-features (measure off)",
            "tokio": f"{RT_MICRO}: tokio {tokio} current_thread, release, lto fat, --locked",
        },
        "n": args.n, "rounds": args.rounds,
    }


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--nodus", help="micro bench binary, default features")
    ap.add_argument("--nodus-nomeasure", help="micro bench binary built with --no-default-features")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--n", type=int, default=1_000_000, help="ops per run (timers too)")
    ap.add_argument("--quick", action="store_true", help="200k ops, 2 rounds (a smoke run; not for claims)")
    ap.add_argument("--only", default="micro", help="comma-separated sections: " + ",".join(SECTIONS))
    ap.add_argument("--report", help="only print the tables of an existing results.json")
    args = ap.parse_args()
    if args.report:
        print(report(json.load(open(args.report))["results"]))
        return
    if not (args.nodus and args.nodus_nomeasure):
        ap.error("--nodus and --nodus-nomeasure are required (bench/run.sh passes them)")
    if args.quick:
        args.n, args.rounds = 200_000, 2
    stamp = _dt.datetime.now().strftime("%Y%m%d-%H%M%S")
    outdir = os.path.join(HERE, "results", stamp)
    os.makedirs(outdir)
    env = environment(args)
    env["command"] = " ".join(shlex.quote(a) for a in sys.argv)
    results = []

    def flush():
        with open(os.path.join(outdir, "results.json"), "w") as f:
            json.dump({"environment": env, "results": results}, f, indent=1)

    log("environment: " + json.dumps(env, indent=1))
    for name in args.only.split(","):
        SECTIONS[name](args, results, flush)
    flush()
    text = "\n".join(f"- {k}: {v}" for k, v in env.items() if k != "builds")
    text += "\n" + "\n".join(f"- build {k}: {v}" for k, v in env["builds"].items())
    text += "\n\n" + report(results) + "\n"
    with open(os.path.join(outdir, "summary.md"), "w") as f:
        f.write(text)
    print(text)
    log(f"results in {outdir}")


if __name__ == "__main__":
    main()
