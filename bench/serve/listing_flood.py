#!/usr/bin/env python3
"""bench/serve/listing_flood.py: how long an ordinary request waits after a flood of abandoned
directory-listing requests (the security review's attack on `nodus serve`, BENCHMARKS.md "`nodus
serve` under a listing flood"). Stdlib only.

Usage: bench/serve/listing_flood.py [--rounds R] [--requests N] [--entries E] NAME=NODUS_BINARY ...
Each round starts every binary in turn (interleaved) as `BINARY serve TREE --listen 127.0.0.1:PORT
--workers 1`, on a tree with `mid/` holding E empty files and no index.html, and a 575 KiB
`probe.txt`. It sends N requests `GET /mid/`, each connection closed right after its request is
sent (an HTTP/1 client that leaves cannot be told from one that half-closed, so each is answered),
then times `GET /probe.txt` until its first byte (30 s at most). The server is stopped by its PID
after each round. Prints each round's wait and the median per binary.
"""
import argparse, os, shutil, signal, socket, statistics, subprocess, sys, tempfile, time


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def make_tree(entries):
    root = tempfile.mkdtemp(prefix="nodus-listing-flood-")
    os.mkdir(os.path.join(root, "mid"))
    for i in range(entries):
        open(os.path.join(root, "mid", "pkg-%05d.tar.gz" % i), "w").close()
    with open(os.path.join(root, "probe.txt"), "w") as f:
        f.write("".join("%07d\n" % i for i in range(73_600)))
    return root


def wait_listening(port, proc, limit=20.0):
    end = time.monotonic() + limit
    while time.monotonic() < end:
        if proc.poll() is not None:
            sys.exit(f"server exited with {proc.returncode}")
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            return
        except OSError:
            time.sleep(0.05)
    sys.exit("server never listened")


def flood(port, n):
    request = b"GET /mid/ HTTP/1.1\r\nHost: x\r\n\r\n"
    for _ in range(n):
        with socket.create_connection(("127.0.0.1", port)) as s:
            s.sendall(request)


def probe(port):
    start = time.monotonic()
    with socket.create_connection(("127.0.0.1", port), timeout=30) as s:
        s.sendall(b"GET /probe.txt HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
        try:
            first = s.recv(1)
        except socket.timeout:
            return None
    return time.monotonic() - start if first else None


def one(binary, root, n):
    port = free_port()
    proc = subprocess.Popen([binary, "serve", root, "--listen", f"127.0.0.1:{port}", "--workers", "1"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    try:
        wait_listening(port, proc)
        flood(port, n)
        return probe(port)
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait()


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--requests", type=int, default=1000)
    ap.add_argument("--entries", type=int, default=5000)
    ap.add_argument("servers", nargs="+", metavar="NAME=BINARY")
    args = ap.parse_args()
    servers = [s.split("=", 1) for s in args.servers]
    root = make_tree(args.entries)
    waits = {name: [] for name, _ in servers}
    try:
        for r in range(1, args.rounds + 1):
            for name, binary in servers:
                w = one(binary, root, args.requests)
                waits[name].append(w)
                print(f"round {r} {name}: " + ("no first byte within 30 s" if w is None else f"{w:.3f} s"),
                      flush=True)
    finally:
        shutil.rmtree(root, ignore_errors=True)
    for name, ws in waits.items():
        got = [w for w in ws if w is not None]
        med = f"{statistics.median(got):.3f} s" if len(got) == len(ws) else f"{len(ws) - len(got)} timed out"
        print(f"{name}: median {med} over {len(ws)} rounds")


main()
