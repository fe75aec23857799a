#!/usr/bin/env bash
# Remakes docs/admin-page.png and docs/admin-page-cluster.png (the README's pictures of the
# /_nodus/ page): `nodus serve` on 127.0.0.1, a single process and then a `--workers 2` cluster,
# each under wrk load while its /_nodus/ page is open in headless Chromium, which photographs it
# at 1440×1000 once the load has run (the page's charts keep what it polled itself, one sample a
# second).
#
#   docs/admin-page.sh [OUT_DIR]      # OUT_DIR: docs by default
#
# Needs wrk, chromium and python3 (`apt-get install wrk chromium`). NODUS names the nodus binary
# to run; by default the script builds the release one (`cargo build --release`). LOAD_SECONDS
# (60 by default) is how long the page is open under load before each picture. Chromium is driven over its
# DevTools pipe (`--remote-debugging-pipe`) by a small python3 program, no other package. Every
# process it starts is stopped by its PID at the end, whatever happens (an EXIT trap); the
# temporary directory is removed.
set -euo pipefail
cd "$(dirname "$0")/.."

out=${1:-docs}
load_seconds=${LOAD_SECONDS:-60}
. docs/lib.sh
needs docs/admin-page.sh wrk chromium python3
nodus_binary

work=$(mktemp -d)
serve_pid=""
shot_pid=""
idle_pid=""
load_pids=()
stop_all() {
  for pid in "${load_pids[@]}"; do stop "$pid"; done
  load_pids=()
  [ -n "$idle_pid" ] && stop "$idle_pid"
  [ -n "$shot_pid" ] && stop "$shot_pid"
  [ -n "$serve_pid" ] && stop "$serve_pid" && { wait "$serve_pid" 2>/dev/null || true; }
  idle_pid="" shot_pid="" serve_pid=""
}
cleanup() {
  stop_all
  rm -rf "$work"
}
trap cleanup EXIT

make_site "$work/site"

# Opens URL in headless Chromium at 1440×1000, waits SECONDS, writes the viewport to OUT (PNG).
# Chromium is its child, spoken to over fds 3 and 4 (NUL-ended JSON) and stopped by its PID.
cat > "$work/shot.py" <<'PY'
import base64, fcntl, json, os, signal, subprocess, sys, time

url, seconds, out, profile = sys.argv[1], float(sys.argv[2]), sys.argv[3], sys.argv[4]
signal.signal(signal.SIGTERM, lambda *_: sys.exit(1))
# The child's fd 3 is what it reads, fd 4 what it writes: the pipes' ends are moved above 10
# first, so that putting one on 3 or 4 never closes the other.
def high(fd):
    moved = fcntl.fcntl(fd, fcntl.F_DUPFD_CLOEXEC, 10)
    os.close(fd)
    return moved
to_chrome_r, to_chrome_w = map(high, os.pipe())
from_chrome_r, from_chrome_w = map(high, os.pipe())
def fds():
    os.dup2(to_chrome_r, 3)
    os.dup2(from_chrome_w, 4)
chrome = subprocess.Popen(
    ["chromium", "--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars",
     "--remote-debugging-pipe", f"--user-data-dir={profile}", "about:blank"],
    preexec_fn=fds, close_fds=False,
    stdout=subprocess.DEVNULL, stderr=open(profile + ".log", "w"))
os.close(to_chrome_r)
os.close(from_chrome_w)
writer, reader = os.fdopen(to_chrome_w, "wb", 0), os.fdopen(from_chrome_r, "rb", 0)
buffered, next_id = b"", 0

def call(method, session=None, **params):
    global buffered, next_id
    next_id += 1
    msg = {"id": next_id, "method": method, "params": params}
    if session:
        msg["sessionId"] = session
    writer.write(json.dumps(msg).encode() + b"\0")
    while True:  # events in between are skipped
        while b"\0" not in buffered:
            chunk = reader.read(1 << 16)
            if not chunk:
                sys.exit(f"chromium closed its pipe during {method}")
            buffered += chunk
        line, buffered = buffered.split(b"\0", 1)
        reply = json.loads(line)
        if reply.get("id") == next_id:
            if "error" in reply:
                sys.exit(f"{method}: {reply['error']}")
            return reply["result"]

try:
    target = call("Target.createTarget", url="about:blank")["targetId"]
    session = call("Target.attachToTarget", targetId=target, flatten=True)["sessionId"]
    call("Emulation.setDeviceMetricsOverride", session,
         width=1440, height=1000, deviceScaleFactor=1, mobile=False)
    call("Page.navigate", session, url=url)
    time.sleep(seconds)
    png = call("Page.captureScreenshot", session, format="png")["data"]
    open(out, "wb").write(base64.b64decode(png))
    call("Browser.close")
    chrome.wait(timeout=10)
finally:
    if chrome.poll() is None:
        chrome.kill()
        chrome.wait()
PY

# photograph WORKERS READY_LINE OUT: nodus serve with WORKERS workers, its page photographed
# under load once READY_LINE is in its log.
photograph() {
  local workers=$1 ready=$2 png=$3 log="$work/serve-$1.log"
  "$NODUS" serve "$work/site" --workers "$workers" --listen 127.0.0.1:0 2> "$log" &
  serve_pid=$!
  for _ in $(seq 200); do grep -q "$ready" "$log" && break; sleep 0.1; done
  local addr
  addr=$(grep -o 'on http://[0-9.:]*' "$log" | head -n 1 | sed 's|.*http://||')
  [ -n "$addr" ] || { cat "$log" >&2; exit 1; }

  python3 "$work/shot.py" "http://$addr/_nodus/" "$load_seconds" "$work/shot.png" \
    "$work/chromium-$workers" &
  shot_pid=$!
  idle_clients "$addr" "$((load_seconds + 10))"

  # The load's rounds go on until the picture is taken.
  local round=0
  while kill -0 "$shot_pid" 2>/dev/null; do
    load_round "$addr" "$round"
    round=$((round + 1))
    [ $((round % 5)) -eq 0 ] && sleep 1 # a quieter moment now and then
  done

  wait "$shot_pid" || { cat "$work/chromium-$workers.log" >&2; exit 1; }
  shot_pid=""
  cp "$work/shot.png" "$png"
  echo "wrote $png (the /_nodus/ page of nodus serve --workers $workers on $addr)"
  stop_all
}

photograph 1 "on http://" "$out/admin-page.png"
photograph 2 "workers ready" "$out/admin-page-cluster.png"
