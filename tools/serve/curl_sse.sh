#!/usr/bin/env bash
# SSE as curl sees it: every event is `data: ...` followed by a blank line,
# the stream ends with `data: [DONE]`, and the chunks carry one id.
# Usage: curl_sse.sh [BASE_URL]   (default http://127.0.0.1:8080)
set -euo pipefail
url=${1:-http://127.0.0.1:8080}
auth=()
[[ -n "${FERROX_API_KEY:-}" ]] && auth=(-H "Authorization: Bearer $FERROX_API_KEY")
out=$(mktemp)
trap 'rm -f "$out"' EXIT
code=$(curl -sN -o "$out" -w '%{http_code} %{content_type}' "${auth[@]}" "$url/v1/chat/completions" \
  -H 'Content-Type: application/json' \
  -d '{"messages":[{"role":"user","content":"Say hi."}],"max_tokens":12,"stream":true,"stream_options":{"include_usage":true}}')
fail() { echo "FAIL curl_sse: $*"; cat "$out"; exit 1; }
[[ "$code" == "200 text/event-stream"* ]] || fail "status/content type: $code"
# Odd lines are events, even lines blank.
awk 'NR % 2 == 1 && !/^data: / { exit 1 } NR % 2 == 0 && length($0) > 0 { exit 1 }' "$out" || fail "not data:/blank pairs"
[[ "$(tail -n 2 "$out" | head -n 1)" == "data: [DONE]" ]] || fail "does not end with data: [DONE]"
n_ids=$(grep -o '"id":"[^"]*"' "$out" | sort -u | wc -l)
[[ "$n_ids" == 1 ]] || fail "$n_ids distinct ids"
grep -q '"usage":{' "$out" || fail "no usage chunk"
grep -q '"finish_reason":"\(stop\|length\)"' "$out" || fail "no finish_reason"
echo "ok    curl_sse ($(grep -c '^data: ' "$out") events)"
