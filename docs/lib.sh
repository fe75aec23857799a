# docs/lib.sh: what docs/top.sh and docs/admin-page.sh share; sourced by them, not run.
# The sourcing script sets `work` (its temporary directory) and keeps `idle_pid` and `load_pids`
# for its cleanup, which stops each with `stop`.

# needs SCRIPT TOOL...: exits 1 naming the first TOOL that is not installed.
needs() {
  local script=$1 tool
  shift
  for tool; do
    command -v "$tool" >/dev/null || { echo "$script needs $tool" >&2; exit 1; }
  done
}

# Sets NODUS to the release binary, built now, unless NODUS already names one.
nodus_binary() {
  if [ -z "${NODUS:-}" ]; then
    cargo build --release -p nodus-cli
    NODUS=${CARGO_TARGET_DIR:-target}/release/nodus
  fi
}

# stop PID: SIGTERM, then SIGKILL if it is still there after 5 s.
stop() {
  local pid=$1
  kill -TERM "$pid" 2>/dev/null || return 0
  for _ in $(seq 50); do kill -0 "$pid" 2>/dev/null || return 0; sleep 0.1; done
  kill -KILL "$pid" 2>/dev/null || true
}

# make_site DIR: a small page and a 256 KiB file (read in 64 KiB chunks on the I/O pool).
make_site() {
  mkdir "$1"
  printf '<!doctype html><title>nodus</title><p>hello\n' > "$1/index.html"
  head -c 262144 /dev/urandom > "$1/big.bin"
}

# idle_clients ADDR SECONDS: in the background (its pid in `idle_pid`), browsers' way: two
# connections a second that ask for the page (one in four for a missing file: the 4xx count) and
# then stay idle until the server's keep-alive timer (5 s) closes them: the timers whose lateness
# the pictures show.
idle_clients() {
  python3 - "$1" "$2" <<'PY' &
import socket, sys, time
host, port = sys.argv[1].rsplit(":", 1)
idle, end = [], time.monotonic() + float(sys.argv[2])
while time.monotonic() < end:
    s = socket.create_connection((host, int(port)))
    path = b"/missing" if len(idle) % 4 == 3 else b"/"
    s.sendall(b"GET " + path + b" HTTP/1.1\r\nHost: nodus\r\n\r\n")
    idle.append(s)
    time.sleep(0.5)
PY
  idle_pid=$!
}

# load_round ADDR ROUND: one round of load that varies with ROUND, so the charts show it: 3 s at 4
# to 16 connections on the page and a steady trickle of the large file (their pids in
# `load_pids` while they run).
load_round() {
  local addr=$1 conns=$(( ($2 % 4 + 1) * 4 ))
  wrk -t 1 -c 2 -d 3s "http://$addr/big.bin" > /dev/null &
  load_pids=($!)
  wrk -t 1 -c "$conns" -d 3s "http://$addr/index.html" > /dev/null &
  load_pids+=($!)
  wait "${load_pids[@]}"
  load_pids=()
}
