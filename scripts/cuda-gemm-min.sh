#!/usr/bin/env bash
# Where a CUDA batch should leave the per-token matvecs for the F16 GEMM, measured on a server's
# decode steps: one device-tool call carrying $D (target/devmoe, as scripts/cuda-serve.sh wants it,
# plus $D/tests/ferrox_core: `cargo test --release -p ferrox-core --features cuda,measure --lib
# --no-run`, stripped; the ferrox binary built with `--features cuda,measure`).
#   1. The CUDA conformance suite with FERROX_CUDA_GEMM_MIN=$MIN: its 13-token batches then take
#      the matvecs, so the larger batches they were not written for are checked against the CPU.
#   2. scripts/cuda-serve.sh at $CLIENTS streams without llama-server, ferrox at the default and
#      with FERROX_CUDA_GEMM_MIN=$MIN (set "serve-cuda-ab" lines in $OUT/serve.jsonl).
# Env: MIN (64), CLIENTS ("16 64"), COMMIT, MACHINE, SKIP_TESTS=1 (step 2 only).
set -u
D=${D:-target/devmoe}
OUT=${OUT:-/tmp/ferrox-out}
MIN=${MIN:-64}
mkdir -p "$OUT" /tmp/logs
export FERROX_CUDA_CACHE=/tmp/ferrox-cuda-cache FERROX_REQUIRE_GPU=1 HOME=${HOME:-/root}
if [ -x $D/tests/ferrox_core ] && [ "${SKIP_TESTS:-0}" != 1 ]; then
  FERROX_CUDA_GEMM_MIN=$MIN timeout 200 $D/tests/ferrox_core backend::conformance::Cuda --test-threads=1 \
    >/tmp/logs/tests-gemm-min.log 2>&1
  echo "conformance with FERROX_CUDA_GEMM_MIN=$MIN rc=$?: $(grep -E '^test result' /tmp/logs/tests-gemm-min.log | tail -1)"
  grep -E "panicked|FAILED" /tmp/logs/tests-gemm-min.log | head -5
fi
NO_LLAMA=1 CLIENTS=${CLIENTS:-16 64} VARIANTS="gemm$MIN=FERROX_CUDA_GEMM_MIN=$MIN" D=$D OUT=$OUT bash scripts/cuda-serve.sh
