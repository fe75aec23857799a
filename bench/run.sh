#!/usr/bin/env bash
# bench/run.sh: the one command behind every number in BENCHMARKS.md. Builds nodus's micro
# benchmark twice (default features, and with `measure` compiled out) and the tokio peer, then
# runs nodus, Node and tokio in interleaved rounds (bench/bench.py) and prints medians and ratios.
# Results: bench/results/<stamp>/. Needs cargo, python3 and node (installed with apt if missing).
#
# Usage: bench/run.sh [--quick] [--rounds N] [--n OPS]     (any bench.py option)
set -euo pipefail
cd "$(dirname "$0")/.."

if ! command -v node >/dev/null; then
  apt-get update && apt-get install -y nodejs
fi

# Builds with cargo and prints the path of the `micro` bench executable.
micro_exe() {
  cargo bench --locked -p nodus --bench micro --no-run --message-format=json-render-diagnostics "$@" |
    python3 -c 'import json, sys
exe = [m["executable"] for m in map(json.loads, sys.stdin)
       if m.get("reason") == "compiler-artifact" and m["target"]["name"] == "micro" and m.get("executable")]
print(exe[-1]) if exe else sys.exit("bench/run.sh: the micro bench did not build")'
}

echo "building nodus micro bench (default features: measure)" >&2
NODUS=$(micro_exe)
echo "building nodus micro bench (--no-default-features: measure off)" >&2
NODUS_NOMEASURE=$(micro_exe --no-default-features --target-dir target/bench-nomeasure)
echo "building the tokio peer" >&2
(cd bench/rust && cargo build --release --locked --bin rt_micro)

exec python3 bench/bench.py --nodus "$NODUS" --nodus-nomeasure "$NODUS_NOMEASURE" "$@"
