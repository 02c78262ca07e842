#!/usr/bin/env bash
# The small-batch tensor-core GEMM (`mmq_<kind>_n<t>`) on the device, one device-tool call
# carrying $D (target/devmoe, as scripts/cuda-serve.sh wants it, plus $D/tests/ferrox_core:
# `cargo test --release -p ferrox-core --features cuda,measure --lib --no-run`, stripped; the
# ferrox binary built with `--features cuda,measure`):
#   1. The CUDA tests (`backend::cuda`, the conformance suite): the new GEMM against the f64 dot
#      at every token tile, and the model-level batches that now take it against the CPU.
#   2. scripts/cuda-serve.sh at $CLIENTS streams, ferrox at the default and with
#      FERROX_CUDA_MMA_MAX=0 (the dequantize + cuBLAS GEMM it replaces): set "serve-cuda-ab";
#      with $D/llama-src.tgz and LLAMA=1, llama-server too (set "serve-cuda").
#   3. `ferrox bench` prefill of 16 to 512 tokens on the same file, both ways:
#      $OUT/bench-mma.jsonl; and where a 64-token forward's time goes, both ways, from a kernel
#      trace (tools/cuda/trace.py): $OUT/trace-mma.txt.
# Env: CLIENTS ("16 64"), VARIANTS (more "name=VAR=value" sets for cuda-serve.sh), COMMIT,
# MACHINE, SKIP_TESTS=1, LLAMA=1.
set -u
D=${D:-target/devmoe}
OUT=${OUT:-/tmp/ferrox-out}
mkdir -p "$OUT" /tmp/logs
export FERROX_CUDA_CACHE=/tmp/ferrox-cuda-cache FERROX_REQUIRE_GPU=1 HOME=${HOME:-/root}
if [ -x $D/tests/ferrox_core ] && [ "${SKIP_TESTS:-0}" != 1 ]; then
  timeout 240 $D/tests/ferrox_core backend::cuda conformance::Cuda --test-threads=1 >/tmp/logs/tests-mma.log 2>&1
  echo "CUDA tests rc=$?: $(grep -E '^test result' /tmp/logs/tests-mma.log | tail -1)"
  grep -E "panicked|FAILED|NOT CHECKED" /tmp/logs/tests-mma.log | head -8
  cp /tmp/logs/tests-mma.log "$OUT/"
fi
NO_LLAMA=$([ "${LLAMA:-0}" = 1 ] && echo 0 || echo 1) CLIENTS=${CLIENTS:-16 64} \
  VARIANTS="nomma=FERROX_CUDA_MMA_MAX=0 ${VARIANTS:-}" D=$D OUT=$OUT bash scripts/cuda-serve.sh
f=/tmp/models/llama-8b-Q4_K_M.gguf
for v in default FERROX_CUDA_MMA_MAX=0; do
  env $([ $v = default ] || echo $v) $D/ferrox bench --backend cuda -m $f -p 16,32,64,128,256,512 -n 0 -r 5 -o jsonl 2>/tmp/logs/bench-$v.log |
    python3 -c "import json,sys
for l in sys.stdin:
    d = json.loads(l); print(json.dumps(dict(variant='$v', n_prompt=d['n_prompt'], avg_ts=d['avg_ts'], stddev_ts=d['stddev_ts'])))" >>"$OUT/bench-mma.jsonl"
done
cat "$OUT/bench-mma.jsonl"
for v in default FERROX_CUDA_MMA_MAX=0; do
  env $([ $v = default ] || echo $v) FERROX_CUDA_DEFINES=FERROX_TRACE=1 FERROX_CUDA_TRACE=/tmp/logs/trace-$v.txt \
    $D/ferrox bench --backend cuda -m $f -p 64 -n 0 -r 3 >/dev/null 2>>/tmp/logs/bench-$v.log
  { echo "== $v: bench -p 64"; python3 tools/cuda/trace.py /tmp/logs/trace-$v.txt --positions 0; } >>"$OUT/trace-mma.txt" 2>&1
done
cat "$OUT/trace-mma.txt"
# The device tool brings back a handful of files: the raw per-engine ones in one.
tar czf "$OUT/raw.tgz" -C "$OUT" $(cd "$OUT" && ls load-*.txt metrics-*.txt gpu.txt 2>/dev/null) && rm -f "$OUT"/load-*.txt "$OUT"/metrics-*.txt "$OUT"/gpu.txt
tar czf "$OUT/logs.tgz" -C /tmp/logs .
