#!/usr/bin/env bash
# bench/http/pinned.sh: CPU per keep-alive request of a one-process server pinned to CPU 1, its
# load (loadmulti.c: 16 connections, one request in flight on each) pinned to CPU 0, so that the
# server has a core of its own and the load's CPU is not counted. The server's CPU is its main
# thread's time on a CPU (/proc/PID/task/PID/schedstat) over N requests after 20,000 of warm-up;
# with perf, the kernel's share of it from cpu-clock samples. Variants run interleaved, ROUNDS
# times; medians at the end. The session 26 return-stack A/B in BENCHMARKS.md comes from it:
#   bench/http/pinned.sh -r 6 off='env NODUS_RSB_REFILL=off target/release/examples/hello_http {port}' \
#                             on='target/release/examples/hello_http {port}'
# Usage: bench/http/pinned.sh [-r ROUNDS] [-n N] NAME='CMD {port}' [NAME='CMD {port}' ...]
# Needs gcc, taskset, python3; perf optional. Every server is stopped by its PID.
set -euo pipefail
rounds=3 n=150000
while getopts "r:n:" opt; do
  case $opt in
    r) rounds=$OPTARG ;;
    n) n=$OPTARG ;;
    *) sed -n '2,12p' "$0"; exit 2 ;;
  esac
done
shift $((OPTIND - 1))
[ $# -ge 1 ] || { sed -n '2,12p' "$0"; exit 2; }
here=$(cd "$(dirname "$0")" && pwd)
out=$(mktemp -d)
server=""
cleanup() { [ -n "$server" ] && kill -KILL "$server" 2>/dev/null || true; rm -rf "$out"; }
trap cleanup EXIT
gcc -O2 -o "$out/loadmulti" "$here/loadmulti.c"

port=$((22000 + RANDOM % 2000))
for round in $(seq "$rounds"); do
  for variant in "$@"; do
    name=${variant%%=*} cmd=${variant#*=}
    port=$((port + 1))
    taskset -c 1 bash -c "exec ${cmd//\{port\}/$port}" >/dev/null 2>&1 &
    server=$!
    sleep 1.5
    timeout 60 taskset -c 0 "$out/loadmulti" "$port" 16 20000 >/dev/null
    sampler=""
    if command -v perf >/dev/null; then
      perf record -q -e cpu-clock -F 4999 -t "$server" -o "$out/perf.data" >/dev/null 2>&1 &
      sampler=$!
      sleep 0.3
    fi
    read -r before _ <"/proc/$server/task/$server/schedstat"
    timeout 120 taskset -c 0 "$out/loadmulti" "$port" 16 "$n" >/dev/null
    read -r after _ <"/proc/$server/task/$server/schedstat"
    kernel=""
    if [ -n "$sampler" ]; then
      kill -INT "$sampler"; wait "$sampler" 2>/dev/null || true
      kernel=$(perf script -i "$out/perf.data" -F ip 2>/dev/null |
        awk '{ if (substr($1, 1, 4) == "ffff") k++; n++ } END { if (n) printf "%.4f", k / n }')
    fi
    kill -TERM "$server"; wait "$server" 2>/dev/null || true
    server=""
    echo "$name $round $(((after - before) / n)) ${kernel:-nan}" >>"$out/rows"
    tail -1 "$out/rows" | awk '{ printf "round %s %-10s %6.2f µs/req", $2, $1, $3 / 1000;
      if ($4 != "nan") printf "  kernel %5.2f µs/req", $3 * $4 / 1000; print "" }'
  done
done
python3 - "$out/rows" <<'PY'
import collections, statistics, sys
rows = collections.defaultdict(list)
for line in open(sys.argv[1]):
    name, _, ns, share = line.split()
    rows[name].append((int(ns) / 1000, float(share)))
print("medians:")
for name, r in rows.items():
    cpu = statistics.median(x[0] for x in r)
    line = f"  {name:10s} {cpu:6.2f} µs/req (by round: {', '.join(f'{x[0]:.2f}' for x in r)})"
    shares = [x[0] * x[1] for x in r if x[1] == x[1]]
    if shares:
        line += f"  kernel {statistics.median(shares):5.2f} µs/req"
    print(line)
PY
