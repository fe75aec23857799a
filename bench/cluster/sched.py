#!/usr/bin/env python3
"""bench/cluster/sched.py: start a cluster command, then set its workers' scheduling (BENCHMARKS.md,
"Where the rest of the kernel time goes": SCHED_BATCH and EEVDF custom slices measured as variants of
`bench/cluster/ab.sh`).

Usage: bench/cluster/sched.py POLICY SLICE_NS -- CMD [ARGS...]
  POLICY    other | batch (SCHED_OTHER, SCHED_BATCH)
  SLICE_NS  the fair scheduler's custom slice for them (sched_attr.sched_runtime, Linux 6.12+;
            0 keeps the default)
One second after CMD starts, every direct child of it (a cluster primary's workers) gets POLICY and
SLICE_NS on its main thread through sched_setattr(2). CMD is waited for; a SIGTERM or SIGINT to this
script is passed on to it. Example (one round each, keep-alive):
  bench/cluster/ab.sh -r 4 \\
    base='bench/cluster/sched.py other 0 -- target/release/examples/cluster --workers 2 --policy rr --listen 127.0.0.1:{port}' \\
    batch='bench/cluster/sched.py batch 0 -- target/release/examples/cluster --workers 2 --policy rr --listen 127.0.0.1:{port}'
"""
import ctypes, os, platform, signal, struct, subprocess, sys, time

POLICIES = {"other": 0, "batch": 3}
SYS_SCHED_SETATTR = {"x86_64": 314, "aarch64": 274}[platform.machine()]
libc = ctypes.CDLL(None, use_errno=True)


def set_sched(tid, policy, slice_ns):
    # struct sched_attr (version 1, 56 bytes): size, policy, flags, nice, priority, runtime,
    # deadline, period, util_min, util_max.
    attr = struct.pack("=IIqiIQQQII", 56, policy, 0, 0, 0, slice_ns, 0, 0, 0, 0)
    buf = ctypes.create_string_buffer(attr, len(attr))
    if libc.syscall(SYS_SCHED_SETATTR, tid, buf, 0) != 0:
        err = ctypes.get_errno()
        sys.exit(f"sched_setattr({tid}): {os.strerror(err)}")


def children(pid):
    with open(f"/proc/{pid}/task/{pid}/children") as f:
        return [int(p) for p in f.read().split()]


def main():
    if len(sys.argv) < 5 or sys.argv[3] != "--" or sys.argv[1] not in POLICIES:
        sys.exit(__doc__)
    policy, slice_ns, cmd = POLICIES[sys.argv[1]], int(sys.argv[2]), sys.argv[4:]
    child = subprocess.Popen(cmd)
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda s, _: child.send_signal(s))
    time.sleep(1)
    workers = children(child.pid)
    for w in workers:
        set_sched(w, policy, slice_ns)
    print(f"sched.py: {sys.argv[1]}, slice {slice_ns} ns, on workers {workers}", file=sys.stderr)
    sys.exit(child.wait())


main()
