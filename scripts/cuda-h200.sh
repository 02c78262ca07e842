#!/usr/bin/env bash
# One device-tool call on the H200 (kind nvidia-h200): the CUDA tests, then
# the decode/prefill benchmark of a synthetic llama-1b. Everything it needs is
# built here and carried in devbin/ (the layout of scripts/cuda-side-by-side.sh's header):
#   $D/ferrox                   cargo build --release -p ferrox --features cuda
#   $D/tests/*                  cargo test -p ferrox-core --features cuda --no-run, cargo test -p ferrox-cuda --no-run
#   devbin/gguf/ + make_synthetic_gguf.py   LLAMA/gguf-py/gguf and ../shared/tools/make_synthetic_gguf.py
# Logs go to $OUT; the last lines printed are the summary.
set -u
D=${D:-devbin}   # where the carried binaries are
OUT=${OUT:-/tmp/ferrox-out}
mkdir -p "$OUT"
export FERROX_CUDA_CACHE=/tmp/ferrox-cuda-cache HOME=${HOME:-/root}
nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.sm,clocks.mem --format=csv >"$OUT/gpu.txt" 2>&1
summary=()

if [ "${SKIP_TESTS:-0}" != 1 ]; then
  for t in $D/tests/*; do
    name=$(basename "$t")
    filter=""
    [ "$name" = ferrox_core ] && filter="backend::"   # the CPU-only tests ran in CI already
    timeout 300 "$t" $filter --test-threads=1 --nocapture >"$OUT/test-$name.log" 2>&1
    rc=$?
    summary+=("test $name rc=$rc: $(grep -E '^test result' "$OUT/test-$name.log" | tail -1)")
    grep -E "NOT CHECKED|panicked|FAILED" "$OUT/test-$name.log" | head -5 | sed "s/^/  $name: /"
  done
fi

M=/tmp/models
mkdir -p $M
export PYTHONPATH=$PWD/$D
t0=$(date +%s)
python3 $D/make_synthetic_gguf.py --shape llama-1b --out $M/llama-1b-f16.gguf --seed 0 --jobs 16 --sha256 >"$OUT/synth.log" 2>&1
summary+=("synthetic llama-1b f16: rc=$? in $(( $(date +%s) - t0 ))s $(grep -i sha256 "$OUT/synth.log" | tail -1)")
for k in ${KINDS:-Q4_0 Q8_0 Q4_K}; do
  $D/ferrox quantize $M/llama-1b-f16.gguf $M/llama-1b-$k.gguf $k -f >>"$OUT/quantize.log" 2>&1
done
# A 512-token prompt: the synthetic vocabulary has no merges, so every byte is
# one token (BOS + 3 bytes of the SentencePiece space + 508 letters).
prompt=$(printf 'a%.0s' $(seq 1 508))
for k in F16 ${KINDS:-Q4_0 Q8_0 Q4_K}; do
  f=$M/llama-1b-$( [ $k = F16 ] && echo f16 || echo $k ).gguf
  $D/ferrox kernels "$f" 2>/dev/null | grep "per decoded token" | sed "s/^/  $k: /" >>"$OUT/bytes.txt"
  for rep in 1 2; do
    $D/ferrox run --backend cuda "$f" -p "$prompt" -n 128 --ignore-eos --temp 0 --no-echo -c 1024 -v \
      >"$OUT/run-$k-$rep.out" 2>"$OUT/run-$k-$rep.err"
    summary+=("llama-1b $k run $rep rc=$?: $(grep 'generated' "$OUT/run-$k-$rep.err" | sed 's/^ferrox: //')")
  done
done
if [ -x $D/kernel_bench ]; then
  timeout 200 $D/kernel_bench >"$OUT/kernel_bench.txt" 2>&1
  summary+=("kernel_bench rc=$?")
fi
cat "$OUT/bytes.txt" 2>/dev/null
cat "$OUT/kernel_bench.txt" 2>/dev/null
printf '%s\n' "${summary[@]}" | tee "$OUT/summary.txt"
# One file back (the tool returns a few files per call).
mkdir -p /tmp/logs && mv "$OUT"/*.log "$OUT"/*.out "$OUT"/*.err /tmp/logs/ 2>/dev/null
tar czf "$OUT/logs.tgz" -C /tmp/logs .
