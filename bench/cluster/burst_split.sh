#!/usr/bin/env bash
# bench/cluster/burst_split.sh: how round-robin spreads a burst of keep-alive connections (a pool
# opening at once) over the workers of `nodus serve --workers 2`: per run, a fresh cluster, one
# `wrk -t1 -cCONNS -d1s` (its connections open together and stay open), then each worker's
# `connections_handed` from `/_nodus/stats` (the readiness polls and the stats request are
# connections too: one to three more in all).
# Prints one `A/B` pair per run.
#
# Usage: bench/cluster/burst_split.sh NODUS_BINARY [RUNS (10)] [CONNS (64)]
# Needs wrk, curl and python3; 127.0.0.1 only; each cluster is stopped by its PID.
set -euo pipefail
[ $# -ge 1 ] || { sed -n '2,10p' "$0"; exit 2; }
bin=$1 runs=${2:-10} conns=${3:-64}
pid=""
cleanup() { [ -n "$pid" ] && kill -TERM "$pid" 2>/dev/null && wait "$pid" 2>/dev/null || true; }
trap cleanup EXIT
port=$((24000 + RANDOM % 4000))
for _ in $(seq 1 "$runs"); do
  port=$((port + 1))
  "$bin" serve --workers 2 --listen "127.0.0.1:$port" >/dev/null 2>&1 &
  pid=$!
  for _ in $(seq 100); do curl -s -o /dev/null -m 1 "http://127.0.0.1:$port/_nodus/readyz" && break; sleep 0.05; done
  sleep 0.5
  wrk -t1 "-c$conns" -d1s "http://127.0.0.1:$port/" >/dev/null
  curl -s "http://127.0.0.1:$port/_nodus/stats" | python3 -c '
import json, sys
print("/".join(str(w["connections_handed"]) for w in json.load(sys.stdin)["workers"]), end=" ", flush=True)'
  kill -TERM "$pid"; wait "$pid" 2>/dev/null || true
  pid=""
done
echo
