#!/usr/bin/env bash
# Starts `ferrox serve` on the real model and runs every client-side check:
# curl SSE, the openai-client checks, the ollama-client checks, schemathesis against /openapi.json (if
# installed), a 32-client streaming load test, then SIGTERM during a stream
# (the stream must finish and the server exit 0).
#
# Usage: tools/serve/run_tests.sh [MODEL]
#   FERROX_BIN   the ferrox binary (default target/release/ferrox)
#   PY           a python with `openai` (and optionally `ollama`, `schemathesis`)
#   LOAD_SECONDS load-test duration (default 60)
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
model=${1:-$HOME/.cache/ferrox/models/gemma-3-270m-q4_k_m.gguf}
bin=${FERROX_BIN:-target/release/ferrox}
py=${PY:-python3}
port=${PORT:-8397}
key=test-key
export FERROX_API_KEY=$key
log=$(mktemp)
"$bin" serve "$model" --port "$port" --parallel 8 -c 8192 --api-key "$key" --shutdown-grace 20 >"$log" 2>&1 &
pid=$!
trap 'kill $pid 2>/dev/null || true; rm -f "$log"' EXIT
for _ in $(seq 100); do curl -sf "http://127.0.0.1:$port/health" >/dev/null && break; sleep 0.2; done
base=http://127.0.0.1:$port

"$here/curl_sse.sh" "$base"
FERROX_URL=$base/v1 "$py" "$here/test_openai.py"
if "$py" -c 'import ollama' 2>/dev/null; then
  FERROX_HOST=$base "$py" "$here/test_ollama.py"
else
  echo "SKIPPED the ollama-client checks: \`ollama\` is not installed for $py (NOT CHECKED)"
fi

if "$py" -c 'import schemathesis' 2>/dev/null; then
  # A server with 96 positions per slot, so any generated request (max_tokens
  # up to 2^20) ends in seconds. Every check but positive_data_acceptance: a
  # schema-valid request may still be refused for what a schema cannot say
  # (roles that do not alternate, a prompt longer than the context).
  "$bin" serve "$model" --port $((port + 1)) --parallel 4 -c 96 --api-key "$key" >/dev/null 2>&1 &
  spid=$!
  for _ in $(seq 100); do curl -sf "http://127.0.0.1:$((port + 1))/health" >/dev/null && break; sleep 0.2; done
  sbase=http://127.0.0.1:$((port + 1))
  (cd "$(mktemp -d)" && "$py" -m schemathesis.cli run "$sbase/openapi.json" --url "$sbase" \
    -H "Authorization: Bearer $key" --checks all --exclude-checks positive_data_acceptance \
    --max-examples "${ST_EXAMPLES:-50}" --request-timeout 120 --generation-database none) || { kill $spid; exit 1; }
  kill -TERM $spid; wait $spid || true
else
  echo "SKIPPED schemathesis: not installed for $py (NOT CHECKED)"
fi

"$py" "$here/load_test.py" --url "$base" --api-key "$key" --clients 32 --seconds "${LOAD_SECONDS:-60}" --max-tokens 16

# SIGTERM while a stream runs: it completes, then the server exits 0.
stream_out=$(mktemp)
curl -sN -H "Authorization: Bearer $key" "$base/v1/chat/completions" -H 'Content-Type: application/json' \
  -d '{"messages":[{"role":"user","content":"Tell a story."}],"max_tokens":40,"ignore_eos":true,"stream":true}' >"$stream_out" &
cpid=$!
sleep 1
kill -TERM $pid
wait $cpid
status=0; wait $pid || status=$?
grep -q '"finish_reason":"length"' "$stream_out" && [[ "$(tail -n 2 "$stream_out" | head -n 1)" == "data: [DONE]" ]] \
  || { echo "FAIL sigterm: the running stream was cut"; cat "$stream_out"; exit 1; }
[[ $status == 0 ]] || { echo "FAIL sigterm: exit status $status"; cat "$log"; exit 1; }
rm -f "$stream_out"
echo "ok    sigterm: the running stream finished and the server exited 0"
