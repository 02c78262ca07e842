#!/usr/bin/env bash
# Aggregate tokens/s and time to first token at 1, 4, 16 and 32 concurrent
# streams: ferrox serve beside llama-server (same model, same machine,
# --parallel equal to the concurrency, 1024 positions per slot, 2 threads),
# one server at a time. Prints one JSON line per (server, concurrency), and appends the
# normalized lines (tok/s and TTFT, ferrox beside llama-server) to benchmarks/results/serve.jsonl
# (RECORD=0: not); `python3 benchmarks/tables.py` regenerates benchmarks/serve.md's tables.
#
# Usage: tools/serve/bench.sh [MODEL]
#   FERROX_BIN, LLAMA_BIN_DIR (with llama-server), SECONDS_PER (default 40),
#   MAX_TOKENS (default 64), LEVELS (default "1 4 16 32"), MACHINE (the lines' label)
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
model=${1:-$HOME/.cache/ferrox/models/gemma-3-270m-q4_k_m.gguf}
fbin=${FERROX_BIN:-target/release/ferrox}
ldir=${LLAMA_BIN_DIR:-$HOME/.cache/ferrox/llama.cpp-build/bin}
secs=${SECONDS_PER:-40}
maxt=${MAX_TOKENS:-64}
port=8411
root=$(cd "$here/../.." && pwd)
raw=$(mktemp)
wait_up() { for _ in $(seq 300); do curl -sf "http://127.0.0.1:$port/health" >/dev/null && return; sleep 0.2; done; echo "server did not start" >&2; exit 1; }
for n in ${LEVELS:-1 4 16 32}; do
  for server in ${SERVERS:-ferrox llama}; do
    if [[ $server == ferrox ]]; then
      "$fbin" serve "$model" --port $port --parallel "$n" -c $((n * 1024)) -t 2 >"${LOG_DIR:-/tmp}/bench-ferrox-$n.log" 2>&1 &
    else
      LD_LIBRARY_PATH=$ldir "$ldir/llama-server" -m "$model" --port $port --parallel "$n" -c $((n * 1024)) -t 2 >"${LOG_DIR:-/tmp}/bench-llama-$n.log" 2>&1 &
    fi
    pid=$!
    trap 'kill $pid 2>/dev/null || true' EXIT
    wait_up
    kill -0 $pid 2>/dev/null || { echo "$server did not start (port $port taken?)" >&2; exit 1; }
    # Warm-up request, then the measured run (EOS ignored so both generate max_tokens).
    python3 "$here/load_test.py" --url "http://127.0.0.1:$port" --clients 1 --requests 1 --seconds 60 --max-tokens 4 >/dev/null
    out=$(python3 "$here/load_test.py" --url "http://127.0.0.1:$port" --clients "$n" --seconds "$secs" --max-tokens "$maxt" --ignore-eos || true)
    echo "{\"server\": \"$server\", \"parallel\": $n, \"result\": $out}" | tee -a "$raw"
    kill -TERM $pid; wait $pid 2>/dev/null || true
  done
done
if [ "${RECORD:-1}" = 1 ] && [ -s "$raw" ]; then
  python3 "$root/benchmarks/harness/record.py" serve --out "$root/benchmarks/results/serve.jsonl" \
    --source "SECONDS_PER=$secs tools/serve/bench.sh" --model "$model" "$raw" > /dev/null
  echo "recorded in benchmarks/results/serve.jsonl" >&2
fi
