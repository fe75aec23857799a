#!/usr/bin/env bash
# Remakes docs/top.png (the README's picture of `nodus top`): a `nodus serve --workers 2`
# cluster on 127.0.0.1 under wrk load, watched by `nodus top` on an 80×24 terminal (a private
# tmux server), its screen captured with its colors, written out as HTML and photographed by
# headless Chromium.
#
#   docs/top.sh [OUT]           # OUT: docs/top.png by default
#
# Needs tmux, wrk, chromium and python3 (`apt-get install tmux wrk chromium`). NODUS names the
# nodus binary to run; by default the script builds the release one (`cargo build --release`).
# LOAD_SECONDS (60 by default) is how long the load runs before the capture: the dashboard's
# charts fill one column a second. Every process it starts is stopped by its PID at the end,
# whatever happens (an EXIT trap); the temporary directory is removed.
set -euo pipefail
cd "$(dirname "$0")/.."

out=${1:-docs/top.png}
load_seconds=${LOAD_SECONDS:-60}
. docs/lib.sh
needs docs/top.sh tmux wrk chromium python3
nodus_binary

work=$(mktemp -d)
sock="nodus-top-$$"
serve_pid=""
tmux_pid=""
top_pid=""
idle_pid=""
load_pids=()
cleanup() {
  for pid in "${load_pids[@]}"; do stop "$pid"; done
  [ -n "$idle_pid" ] && stop "$idle_pid"
  [ -n "$top_pid" ] && stop "$top_pid"
  [ -n "$tmux_pid" ] && stop "$tmux_pid"
  [ -n "$serve_pid" ] && stop "$serve_pid" && wait "$serve_pid" 2>/dev/null
  rm -rf "$work"
}
trap cleanup EXIT

make_site "$work/site"

"$NODUS" serve "$work/site" --workers 2 --listen 127.0.0.1:0 2> "$work/serve.log" &
serve_pid=$!
for _ in $(seq 200); do grep -q "workers ready" "$work/serve.log" && break; sleep 0.1; done
addr=$(grep -o 'serving on http://[0-9.:]*' "$work/serve.log" | head -n 1 | sed 's|.*http://||')
[ -n "$addr" ] || { cat "$work/serve.log" >&2; exit 1; }

tmux -L "$sock" -f /dev/null new-session -d -x 80 -y 24 -s top "$NODUS" top "$addr"
tmux_pid=$(tmux -L "$sock" display-message -p -t top '#{pid}')
top_pid=$(tmux -L "$sock" display-message -p -t top '#{pane_pid}')

idle_clients "$addr" "$((load_seconds + 10))"

end=$((SECONDS + load_seconds))
round=0
while [ "$SECONDS" -lt "$end" ]; do
  load_round "$addr" "$round"
  round=$((round + 1))
  [ $((round % 5)) -eq 0 ] && sleep 2 # a quieter moment now and then
done

tmux -L "$sock" capture-pane -p -e -N -t top > "$work/screen.ansi"

# The captured screen (SGR colors) as an HTML page of 80×24 cells, in a terminal's palette
# (VS Code's).
python3 - "$work/screen.ansi" "$work/screen.html" <<'PY'
import html, re, sys

COLS, ROWS = 80, 24
FG, BG = "#cccccc", "#1e1e1e"
BASE = ["#000000", "#cd3131", "#0dbc79", "#e5e510", "#2472c8", "#bc3fbc", "#11a8cd", "#e5e5e5",
        "#666666", "#f14c4c", "#23d18b", "#f5f543", "#3b8eea", "#d670d6", "#29b8db", "#ffffff"]

def xterm256(n):
    if n < 16:
        return BASE[n]
    if n < 232:
        n -= 16
        steps = [0, 95, 135, 175, 215, 255]
        return "#%02x%02x%02x" % (steps[n // 36], steps[n // 6 % 6], steps[n % 6])
    v = 8 + 10 * (n - 232)
    return "#%02x%02x%02x" % (v, v, v)

def sgr(state, params):
    codes = [int(p) if p else 0 for p in params.split(";")] if params else [0]
    i = 0
    while i < len(codes):
        c = codes[i]
        if c == 0:
            state.clear()
        elif c in (1, 2, 3, 4, 7):
            state[c] = True
        elif c == 22:
            state.pop(1, None); state.pop(2, None)
        elif c in (23, 24, 27):
            state.pop(c - 20, None)
        elif 30 <= c <= 37 or 90 <= c <= 97:
            state["fg"] = BASE[c - 30 if c < 90 else c - 82]
        elif 40 <= c <= 47 or 100 <= c <= 107:
            state["bg"] = BASE[c - 40 if c < 100 else c - 92]
        elif c == 39:
            state.pop("fg", None)
        elif c == 49:
            state.pop("bg", None)
        elif c in (38, 48) and i + 1 < len(codes):
            key = "fg" if c == 38 else "bg"
            if codes[i + 1] == 5 and i + 2 < len(codes):
                state[key] = xterm256(codes[i + 2]); i += 2
            elif codes[i + 1] == 2 and i + 4 < len(codes):
                state[key] = "#%02x%02x%02x" % tuple(codes[i + 2:i + 5]); i += 4
        i += 1

def style(state):
    fg, bg = state.get("fg", FG), state.get("bg", BG)
    if state.get(7):
        fg, bg = bg, fg
    css = [f"color:{fg}", f"background:{bg}"]
    if state.get(1):
        css.append("font-weight:bold")
    if state.get(2):
        css.append("opacity:.7")
    if state.get(3):
        css.append("font-style:italic")
    if state.get(4):
        css.append("text-decoration:underline")
    return ";".join(css)

lines = open(sys.argv[1], encoding="utf-8").read().split("\n")[:ROWS]
lines += [""] * (ROWS - len(lines))
rows, state = [], {}
for line in lines:
    cells = []  # (style, char)
    for token in re.split(r"(\x1b\[[0-9;]*m)", line):
        if token.startswith("\x1b["):
            sgr(state, token[2:-1])
        else:
            cells += [(style(state), ch) for ch in token]
    cells = cells[:COLS] + [(style({}), " ")] * (COLS - len(cells))
    spans, run, text = [], None, ""
    for st, ch in cells + [(None, "")]:
        if st != run and text:
            spans.append(f'<span style="{run}">{html.escape(text)}</span>')
            text = ""
        run, text = st, text + ch
    rows.append("".join(spans))
    state = {}  # tmux starts every captured line afresh

page = f"""<!doctype html><meta charset="utf-8"><style>
html,body{{margin:0;background:{BG}}}
pre{{margin:0;padding:12px;font:16px/20px "DejaVu Sans Mono",monospace;color:{FG}}}
</style><pre>{chr(10).join(rows)}</pre>"""
open(sys.argv[2], "w", encoding="utf-8").write(page)
PY

# 80 cells of DejaVu Sans Mono at 16 px (9.63 px each) and 24 lines of 20 px, 12 px around.
chromium --headless --no-sandbox --disable-gpu --hide-scrollbars --force-device-scale-factor=1 \
  --user-data-dir="$work/chromium" --window-size=795,504 \
  --screenshot="$work/top.png" "file://$work/screen.html" 2> "$work/chromium.log" \
  || { cat "$work/chromium.log" >&2; exit 1; }
cp "$work/top.png" "$out"
echo "wrote $out (nodus top watching $addr)"
