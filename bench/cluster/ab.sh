#!/usr/bin/env bash
# bench/cluster/ab.sh: interleaved A/B of server variants under wrk, counted with `perf stat` over the
# whole process tree (primary and workers): CPU µs, syscalls and context switches per request, the
# cheapest thread's share (a cluster's primary), requests per second. The A/B numbers quoted in
# BENCHMARKS.md's cluster section ("Where the time goes") come from this script.
#
# Usage: bench/cluster/ab.sh [-r ROUNDS] [-c] [-k CONNS] NAME='CMD {port}' [NAME='CMD {port}' ...]
#   -r ROUNDS  interleaved rounds (default 5)
#   -c         one request per connection (wrk -H 'Connection: close'; default keep-alive)
#   -k CONNS   wrk connections (default 32 with -c, 64 without)
#   {port}     replaced by a fresh 127.0.0.1 port per start
# Example (rr against one process):
#   bench/cluster/ab.sh -c rr='target/release/examples/cluster --workers 2 --policy rr --listen 127.0.0.1:{port}' \
#                          one='target/release/examples/hello_http {port}'
# Each start: 1.5 s to come up, 2 s of warm-up load, 5 s measured. Every server runs in its own
# session and is stopped by its process group. Needs perf, wrk, python3.
set -euo pipefail

rounds=5 close=0 conns=""
while getopts "r:ck:" opt; do
  case $opt in
    r) rounds=$OPTARG ;;
    c) close=1 ;;
    k) conns=$OPTARG ;;
    *) sed -n '2,16p' "$0"; exit 2 ;;
  esac
done
shift $((OPTIND - 1))
[ $# -ge 1 ] || { sed -n '2,16p' "$0"; exit 2; }
[ -n "$conns" ] || conns=$([ $close = 1 ] && echo 32 || echo 64)
wrk_args=(-t1 "-c$conns")
[ $close = 1 ] && wrk_args+=(-H "Connection: close")
out=$(mktemp -d)
sid=""
cleanup() { [ -n "$sid" ] && kill -KILL -- "-$sid" 2>/dev/null || true; rm -rf "$out"; }
trap cleanup EXIT

# The next port after $1 that nothing listens on.
free_port() {
  python3 -c 'import socket, sys
p = int(sys.argv[1]) + 1
while True:
    try:
        socket.create_server(("127.0.0.1", p)).close(); print(p); break
    except OSError:
        p += 1' "$1"
}

port=$((19600 + RANDOM % 300))
for round in $(seq "$rounds"); do
  for variant in "$@"; do
    name=${variant%%=*} cmd=${variant#*=}
    port=$(free_port "$port")
    setsid bash -c "exec ${cmd//\{port\}/$port}" >"$out/server.log" 2>&1 &
    sid=$!
    sleep 1.5
    pids=$(ps -o pid= -s "$sid" | tr -d ' ' | paste -sd,)
    timeout 10 wrk "${wrk_args[@]}" -d2s "http://127.0.0.1:$port/" >/dev/null
    timeout 10 perf stat --per-thread -e raw_syscalls:sys_enter,context-switches,task-clock \
      -p "$pids" -o "$out/perf" -- sleep 5 &
    perf_pid=$!
    timeout 10 wrk "${wrk_args[@]}" -d5s "http://127.0.0.1:$port/" >"$out/wrk"
    wait "$perf_pid"
    kill -TERM -- "-$sid" 2>/dev/null || true
    sleep 0.3
    kill -KILL -- "-$sid" 2>/dev/null || true
    sid=""
    requests=$(awk '/requests in/ {print $1}' "$out/wrk")
    python3 - "$name" "$round" "$requests" "$out/perf" >>"$out/rows" <<'PY'
import collections, re, sys
name, rnd, requests, perf = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4]
per = collections.defaultdict(lambda: collections.defaultdict(float))
for line in open(perf):
    m = re.match(r"\s*(\S+)-(\d+)\s+([\d,.]+)\s+(?:msec\s+)?(\S+)", line)
    if m:
        per[m.group(2)][m.group(4)] += float(m.group(3).replace(",", ""))
ms = {k: v["task-clock"] for k, v in per.items()}
total = {e: sum(v[e] for v in per.values()) for e in ("task-clock", "raw_syscalls:sys_enter", "context-switches")}
busy = [v for v in ms.values() if v > 50]
print(name, rnd, requests / 5, total["task-clock"] * 1000 / requests, total["raw_syscalls:sys_enter"] / requests,
      total["context-switches"] / requests, (min(busy) if busy else 0) * 1000 / requests)
PY
    tail -1 "$out/rows" | awk '{printf "round %s %-12s %8.0f req/s  %6.2f µs/req  %5.2f syscalls/req  %5.3f cs/req  cheapest thread %6.2f µs/req\n", $2, $1, $3, $4, $5, $6, $7}'
  done
done
python3 - "$out/rows" <<'PY'
import collections, statistics, sys
rows = collections.defaultdict(list)
for line in open(sys.argv[1]):
    f = line.split()
    rows[f[0]].append([float(x) for x in f[2:]])
print("medians:")
for name, r in rows.items():
    col = lambda i: statistics.median(x[i] for x in r)
    print(f"  {name:12s} {col(0):8.0f} req/s  {col(1):6.2f} µs/req  {col(2):5.2f} syscalls/req  {col(3):5.3f} cs/req  "
          f"cheapest thread {col(4):6.2f} µs/req  (µs/req by round: {', '.join(f'{x[1]:.1f}' for x in r)})")
PY
