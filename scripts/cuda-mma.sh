#!/usr/bin/env bash
# The small-batch tensor-core GEMM (`mmq_<kind>_n<t>`) on the device, one device-tool call
# carrying $D (target/devmoe, as scripts/cuda-serve.sh wants it, plus $D/tests/ferrox_core:
# `cargo test --release -p ferrox-core --features cuda,measure --lib --no-run`, stripped; the
# ferrox binary built with `--features cuda,measure`):
#   1. The CUDA tests (`backend::cuda`, the conformance suite): the new GEMM against the f64 dot
#      at every token tile, and the model-level batches that now take it against the CPU.
#   2. With SERVE=1 (default): scripts/cuda-serve.sh at $CLIENTS streams, ferrox at the default
#      and with FERROX_CUDA_MMA_MAX=0 (the dequantize + cuBLAS GEMM it replaces): set
#      "serve-cuda-ab"; with $D/llama-src.tgz and LLAMA=1, llama-server too (set "serve-cuda").
#      With SERVE=0 the model is only made.
#   3. `ferrox bench` prefill of 16 to 256 tokens on the same file under each of $BENCH
#      (space-separated; `default`, or VAR=value[,VAR=value]): $OUT/bench-mma.jsonl; and where
#      a 64-token forward's time goes at the default, from a kernel trace (tools/cuda/trace.py):
#      $OUT/trace-mma.txt; $OUT/mma.jsonl the results lines (scripts/mma-results.py) for
#      benchmarks/results/cuda-mma.jsonl, $OUT/serve.jsonl those for benchmarks/results/serve.jsonl.
# Env: CLIENTS ("16 64"), VARIANTS (more "name=VAR=value" sets for cuda-serve.sh), BENCH
# ("default FERROX_CUDA_MMA_MAX=0"; empty: none), PP (the prefill sizes), NOMMA=0 (no serving
# run with FERROX_CUDA_MMA_MAX=0), COMMIT, MACHINE,
# SKIP_TESTS=1, SERVE, TRACE=0, SERVE_TRACE=1 (a kernel trace of a serving run), LLAMA=1 (with LLAMA_BUILD_S: the build needs ~400 s of the host's
# 14 cores; 380 s stopped it at 98% beside the bench runs). The side by side alone, in one call:
#   COMMIT=<sha> MACHINE=h200 LLAMA=1 LLAMA_BUILD_S=460 SKIP_TESTS=1 BENCH= TRACE=0 \
#     CLIENTS="1 16 64" bash scripts/cuda-mma.sh
set -u
D=${D:-target/devmoe}
OUT=${OUT:-/tmp/ferrox-out}
mkdir -p "$OUT" /tmp/logs /tmp/models
export FERROX_CUDA_CACHE=/tmp/ferrox-cuda-cache FERROX_REQUIRE_GPU=1 HOME=${HOME:-/root}
# LLAMA=1: llama-server built in the background from the start (niced; LLAMA_BUILD_S, 400),
# run by cuda-serve.sh once built, beside ferrox on the same file and load.
if [ "${LLAMA:-0}" = 1 ] && [ -f $D/llama-src.tgz ]; then
  (timeout ${LLAMA_BUILD_S:-400} bash scripts/cuda-llama-build.sh $D /tmp/logs/llama; touch /tmp/llama-build.done) &
  export LLAMA_BUILDING=1
fi
if [ -x $D/tests/ferrox_core ] && [ "${SKIP_TESTS:-0}" != 1 ]; then
  timeout 240 $D/tests/ferrox_core backend::cuda conformance::Cuda --test-threads=1 >/tmp/logs/tests-mma.log 2>&1
  echo "CUDA tests rc=$?: $(grep -E '^test result' /tmp/logs/tests-mma.log | tail -1)"
  grep -E "panicked|FAILED|NOT CHECKED" /tmp/logs/tests-mma.log | head -8
  cp /tmp/logs/tests-mma.log "$OUT/"
fi
f=/tmp/models/llama-8b-Q4_K_M.gguf
# (a file an earlier step of the same call made is taken as it is)
if [ ! -f $f ]; then
  PYTHONPATH=$PWD/$D python3 $D/make_synthetic_gguf.py --shape llama-8b --out /tmp/models/llama-8b-F16.gguf --seed 0 --jobs 16 >/tmp/logs/synth.log 2>&1
  $D/ferrox quantize /tmp/models/llama-8b-F16.gguf $f Q4_K_M -f >/tmp/logs/quantize.log 2>&1
  echo "model rc=$? ($(du -h $f | cut -f1))"
  rm -f /tmp/models/llama-8b-F16.gguf
fi
for v in ${BENCH-default FERROX_CUDA_MMA_MAX=0}; do
  envs=$([ $v = default ] || echo ${v//,/ })
  env $envs $D/ferrox bench --backend cuda -m $f -p ${PP:-16,32,64,96,128,256} -n 0 -r 5 -o jsonl 2>>/tmp/logs/bench.log |
    python3 -c "import json,sys
for l in sys.stdin:
    d = json.loads(l); print(json.dumps(dict(variant='$v', n_prompt=d['n_prompt'], avg_ts=round(d['avg_ts'], 1), stddev_ts=round(d['stddev_ts'], 1))))" >>"$OUT/bench-mma.jsonl"
done
[ -f "$OUT/bench-mma.jsonl" ] && cat "$OUT/bench-mma.jsonl"
if [ "${SERVE:-1}" = 1 ]; then
  # (cuda-serve.sh takes the file made above)
  NO_LLAMA=1 CLIENTS=${CLIENTS:-16 64} \
    VARIANTS="$([ "${NOMMA:-1}" = 1 ] && echo nomma=FERROX_CUDA_MMA_MAX=0) ${VARIANTS:-}" D=$D OUT=$OUT bash scripts/cuda-serve.sh
  # ferrox alone (and its variants) as set "serve-cuda-mma"; beside llama-server, "serve-cuda".
  sed -i 's/"set": "serve-cuda-solo"/"set": "serve-cuda-mma"/; s/"set": "serve-cuda-ab"/"set": "serve-cuda-mma"/' "$OUT/serve.jsonl"
fi
[ -s "$OUT/bench-mma.jsonl" ] && python3 scripts/mma-results.py "$OUT/bench-mma.jsonl" "${COMMIT:-unknown}" \
  "${MACHINE:-h100}" "$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1)" >"$OUT/mma.jsonl"
if [ "${TRACE:-1}" = 1 ]; then
  FERROX_CUDA_DEFINES=FERROX_TRACE=1 FERROX_CUDA_TRACE=/tmp/logs/trace.txt \
    $D/ferrox bench --backend cuda -m $f -p 64 -n 0 -r 3 >/dev/null 2>>/tmp/logs/bench.log
  { echo "== bench -p 64"; python3 tools/cuda/trace.py /tmp/logs/trace.txt --positions 0 --skip 1; } >"$OUT/trace-mma.txt" 2>&1
  cat "$OUT/trace-mma.txt"
fi
# SERVE_TRACE=1: where a serving step's time goes, from a kernel trace of ferrox serving
# $SERVE_TRACE_CLIENTS (64) clients (the gap after a step's last kernel is the host's share:
# sampling, the next batch's staging and buffers): $OUT/trace-serve.txt.
if [ "${SERVE_TRACE:-0}" = 1 ]; then
  FERROX_CUDA_DEFINES="FERROX_TRACE=1 TRACE_MAX=400000" FERROX_CUDA_TRACE=/tmp/logs/serve-trace.txt \
    $D/ferrox serve $f --backend cuda --port 8419 --parallel 64 -c 65536 >/tmp/logs/serve-trace.log 2>&1 &
  pid=$!
  for _ in $(seq 600); do curl -sf http://127.0.0.1:8419/health >/dev/null && break; sleep 0.5; done
  timeout 240 python3 $D/load_completions.py http://127.0.0.1:8419 ${SERVE_TRACE_CLIENTS:-64} 128 2 2>&1 | tail -1
  curl -s http://127.0.0.1:8419/metrics | grep -E "^ferrox_(engine|batch|steps)" >>/tmp/logs/serve-trace.log
  kill -TERM $pid; wait $pid
  # Steps cut where the GPU waited over 250 us (a server's steps differ in size and share
  # their first kernel's name with other kernels): each size's span and the wait after it.
  { echo "== serve, ${SERVE_TRACE_CLIENTS:-64} clients"; python3 tools/cuda/trace.py /tmp/logs/serve-trace.txt --gap 250 --positions 0;
    grep -E "^ferrox_" /tmp/logs/serve-trace.log; } >"$OUT/trace-serve.txt" 2>&1
  gzip -c /tmp/logs/serve-trace.txt >"$OUT/serve-trace.txt.gz"; rm -f /tmp/logs/serve-trace.txt
  cat "$OUT/trace-serve.txt"
fi
# The device tool brings back a handful of files: the raw per-engine ones in one.
raw=$(cd "$OUT" && ls load-*.txt metrics-*.txt gpu.txt 2>/dev/null)
[ -n "$raw" ] && tar czf "$OUT/raw.tgz" -C "$OUT" $raw && (cd "$OUT" && rm -f $raw)
tar czf "$OUT/logs.tgz" -C /tmp/logs .
