#!/usr/bin/env bash
# bench/http/instructions.sh: user-space instructions per keep-alive request, counted exactly by
# callgrind (valgrind), so that a change of a few per cent in the request path's own work shows
# through the noise of a shared machine (wall-clock A/Bs there spread ±15 %). The kernel's share
# (about 80 % of a request's CPU on loopback) is not counted: this measures nodus's and hyper's work
# on the loop's thread (the main one; the watchdog thread's sampling scales with the run's wall
# time under valgrind, not with the requests, so it is left out).
#
# Usage: bench/http/instructions.sh NAME=BINARY [NAME=BINARY ...]
#   BINARY takes a port as its only argument (`hello_http`). Build it so that it runs under valgrind:
#     RUSTFLAGS=--cfg=rustix_use_libc CARGO_TARGET_DIR=target/valgrind \
#       cargo build --release -p nodus-http --example hello_http
#   (rustix's own auxv reader crashes under valgrind; the libc backend does not).
# Each binary serves 2,000 and then 12,000 requests over 16 keep-alive connections
# (bench/http/keepalive_client.py); the difference of the two totals over 10,000 is the figure, so
# start-up and shutdown cancel out. Needs valgrind and python3. Stops every server by its PID.
set -euo pipefail
[ $# -ge 1 ] || { sed -n '2,14p' "$0"; exit 2; }
here=$(cd "$(dirname "$0")" && pwd)
out=$(mktemp -d)
vg=""
cleanup() { [ -n "$vg" ] && kill -KILL "$vg" 2>/dev/null || true; rm -rf "$out"; }
trap cleanup EXIT

port=$((21000 + RANDOM % 2000))
# Total user-space instructions of BINARY serving N requests.
count() {
  local bin=$1 n=$2
  port=$((port + 1))
  valgrind --tool=callgrind --separate-threads=yes --callgrind-out-file="$out/cg" "$bin" "$port" >/dev/null 2>"$out/vg.log" &
  vg=$!
  timeout 300 python3 "$here/keepalive_client.py" "$port" "$n" 16 >/dev/null
  kill -TERM "$vg"
  wait "$vg" || true
  vg=""
  awk '/^(summary|totals):/ {print $2; exit}' "$out/cg-01"
  rm -f "$out"/cg*
}
for variant in "$@"; do
  name=${variant%%=*} bin=${variant#*=}
  a=$(count "$bin" 2000)
  b=$(count "$bin" 12000)
  echo "$name: $(((b - a) / 10000)) instructions per request"
done
