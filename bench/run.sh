#!/usr/bin/env bash
# bench/run.sh: the one command behind every number in BENCHMARKS.md. Builds what the chosen
# sections need (nodus with default features, and with nodus's `measure` feature compiled out, plus
# the tokio/hyper peers), then runs nodus, Node and tokio in interleaved rounds (bench/bench.py) and
# prints medians and ratios. Results: bench/results/<stamp>/.
#
# Usage: bench/run.sh [--only micro,http,serve,idle,pool,cluster] [--quick] [--rounds N]   (any bench.py option)
#   micro    event-loop microbenchmarks (5 rounds)          about 8 min
#   http     hello-world over HTTP/1.1, wrk, pinned         about 3.5 min (3 rounds)
#   serve    nodus serve vs npm http-server, 4 KiB and 1 MiB about 3.5 min
#   idle     RSS with 10,000 idle keep-alive connections    about 1 min
#   pool     worker-pool benchmarks                         about 2 min
#   cluster  (opt-in) nodus cluster vs Node cluster vs PM2, 2 workers, about 30 min (bench/cluster/run.py; it takes
#            --quick, --rounds, --duration, --quiet-max-wait and --nice; results bench/results/cluster-<stamp>.md)
# Every process and wrk run has a time limit, and every quiet-gate wait is capped (bench.py), so a
# full run takes at most about an hour on 2 cores after the builds.
# On a machine shared with CPU-bound processes: --nice -20 (root) runs every measured process at
# that niceness, and --quiet-max-wait S shortens the wait for a quiet machine (default 60 s).
#
# Needs cargo and python3; installs with apt what is missing (node, npm, wrk) and the npm packages
# of bench/node (http-server and pm2, pinned by package-lock.json) when the serve or cluster section runs.
set -euo pipefail
cd "$(dirname "$0")/.."

ONLY=micro,http,serve,idle,pool
args=("$@")
for ((i = 0; i < ${#args[@]}; i++)); do
  case "${args[i]}" in
    --only) ONLY=${args[i + 1]:-} ;;
    --only=*) ONLY=${args[i]#--only=} ;;
  esac
done
has() { [[ ",$ONLY," == *",$1,"* ]]; }

apt_install() {
  echo "bench/run.sh: installing $* with apt" >&2
  apt-get update -qq && apt-get install -y -qq "$@" >/dev/null
}
if ! command -v node >/dev/null; then apt_install nodejs; fi
if (has http || has serve || has idle || has cluster) && ! command -v wrk >/dev/null; then apt_install wrk; fi
if { has serve && [ ! -f bench/node/node_modules/http-server/bin/http-server ]; } ||
  { has cluster && [ ! -f bench/node/node_modules/pm2/package.json ]; }; then
  if ! command -v npm >/dev/null; then apt_install npm; fi
  (cd bench/node && npm ci --no-audit --no-fund)
fi
# 10,000 idle connections need more than the usual 1,024 descriptors (servers and client inherit).
ulimit -n 65536 2>/dev/null || ulimit -n "$(ulimit -Hn)"

# Builds a cargo bench target (`micro`, `pool`) and prints the path of its executable.
bench_exe() {
  local name=$1
  shift
  cargo bench --locked -p nodus --bench "$name" --no-run --message-format=json-render-diagnostics "$@" |
    python3 -c 'import json, sys
name = sys.argv[1]
exe = [m["executable"] for m in map(json.loads, sys.stdin)
       if m.get("reason") == "compiler-artifact" and m["target"]["name"] == name and m.get("executable")]
print(exe[-1]) if exe else sys.exit("bench/run.sh: the " + name + " bench did not build")' "$name"
}

py_args=()
if has micro; then
  echo "building nodus micro bench (default features: measure)" >&2
  py_args+=(--nodus "$(bench_exe micro)")
  echo "building nodus micro bench (--no-default-features: measure off)" >&2
  py_args+=(--nodus-nomeasure "$(bench_exe micro --no-default-features --target-dir target/bench-nomeasure)")
fi
if has pool; then
  echo "building nodus pool bench (default features, and measure off)" >&2
  py_args+=(--pool "$(bench_exe pool)")
  py_args+=(--pool-nomeasure "$(bench_exe pool --no-default-features --target-dir target/bench-nomeasure)")
fi
if has http || has idle || has cluster; then
  echo "building hello_http (default features: measure on)" >&2
  cargo build --release --locked -p nodus-http --example hello_http
  py_args+=(--hello-http "$PWD/target/release/examples/hello_http")
fi
if has http; then
  # nodus-http passes its `measure` feature (default) to nodus, so --no-default-features on it
  # compiles nodus's measurements out; checked with cargo tree below.
  echo "building hello_http (nodus-http --no-default-features: measure off)" >&2
  cargo build --release --locked -p nodus-http --example hello_http --no-default-features \
    --target-dir target/bench-nomeasure
  if cargo tree --locked -p nodus-http --no-default-features -e features -i nodus | grep -q 'nodus feature "measure"'; then
    echo "bench/run.sh: nodus-http --no-default-features still turns on nodus's measure feature" \
      "(crates/nodus-http/Cargo.toml needs measure = [\"nodus/measure\"] and nodus with default-features = false)" >&2
    exit 1
  fi
  py_args+=(--hello-http-nomeasure "$PWD/target/bench-nomeasure/release/examples/hello_http")
fi
if has serve || has cluster; then
  echo "building nodus (the CLI, default features)" >&2
  cargo build --release --locked -p nodus-cli --bin nodus
  py_args+=(--nodus-cli "$PWD/target/release/nodus")
fi
if has micro || has http || has idle || has pool; then
  echo "building the tokio peers" >&2
  (cd bench/rust && cargo build --release --locked --bins)
fi

if has cluster; then
  echo "building the nodus cluster example" >&2
  cargo build --release --locked -p nodus-http --example cluster
  echo "building bench/cluster/handoff_floor.c" >&2
  gcc -O2 -o target/handoff_floor bench/cluster/handoff_floor.c
  cluster_args=()
  for ((i = 0; i < ${#args[@]}; i++)); do
    case "${args[i]}" in
      --quick | --rounds=* | --duration=* | --quiet-max-wait=* | --nice=*) cluster_args+=("${args[i]}") ;;
      --rounds | --duration | --quiet-max-wait | --nice) cluster_args+=("${args[i]}" "${args[i + 1]:-}") ;;
    esac
  done
  python3 bench/cluster/run.py --cluster "$PWD/target/release/examples/cluster" \
    --nodus-cli "$PWD/target/release/nodus" --hello-http "$PWD/target/release/examples/hello_http" \
    --handoff-floor "$PWD/target/handoff_floor" "${cluster_args[@]}"
fi
REST=$(tr , '\n' <<<"$ONLY" | grep -vx cluster | paste -sd, -) || true
if [ -n "$REST" ]; then
  exec python3 bench/bench.py "${py_args[@]}" "$@" --only "$REST"
fi
