#!/usr/bin/env bash
# One device-tool call on the H200: the CUDA tests (the conformance suite's
# mixture-of-experts block and every architecture's tiny model, qwen3moe and
# a Llama with experts among them), then mixtures of experts end to end:
# synthetic qwen3moe-tiny and an 8-layer cut of qwen3moe-30b (Qwen3-30B-A3B's
# shapes: 128 experts of 768, 8 a token; ~11 GB in F16), in F16 and Q4_K_M
# (`ferrox quantize`), greedy text on the CPU and on CUDA, `ferrox bench`
# tg128/pp512 on CUDA, and the bytes a decoded token reads (`ferrox kernels`).
# Built here and carried in $D (an ignored folder):
#   $D/ferrox                  cargo build --release -p ferrox --features cuda
#   $D/tests/ferrox_core       the ferrox-core test binary built with the cuda feature
#   $D/gguf/, $D/make_synthetic_gguf.py   llama.cpp's gguf-py/gguf and ../shared/tools/make_synthetic_gguf.py
#   $D/llama-src.tgz           optional, with LLAMA=1: the stripped llama.cpp tree, built here in the
#                              background (scripts/cuda-llama-build.sh) for llama-bench -fa 1 on the same files
# SHAPES picks the models (default both), SKIP_TESTS=1 skips the tests, TESTS filters them (default backend::), KINDS the files (F16 Q4_K_M).
# BASE=1 also benches $D/ferrox-base (an earlier build, carried beside it) on the same files;
# TRACE=1 records a kernel trace of a decode and of a 512-token prefill (needs the `measure` feature);
# NCU=1 each kernel's own time in a decode step under Nsight Compute, for ferrox and (with LLAMA=1) llama.cpp.
# Results: $OUT/moe.jsonl (one line per figure), logs in $OUT/logs.tgz.
set -u
D=${D:-target/devmoe}
OUT=${OUT:-/tmp/ferrox-out}
mkdir -p "$OUT" /tmp/logs
export FERROX_CUDA_CACHE=/tmp/ferrox-cuda-cache HOME=${HOME:-/root} FERROX_REQUIRE_GPU=1
T0=$(date +%s); el() { echo "[$(( $(date +%s) - T0 ))s]"; }
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader | tee "$OUT/gpu.txt"
LLPID=
if [ "${LLAMA:-0}" = 1 ] && [ -f $D/llama-src.tgz ]; then
  # (bounded by LLAMA_BUILD_S, default 420: past it the call still returns ferrox's figures)
  timeout ${LLAMA_BUILD_S:-420} bash scripts/cuda-llama-build.sh $D /tmp/logs/llama & LLPID=$!
fi

if [ "${SKIP_TESTS:-0}" != 1 ]; then
  # Vulkan and Metal have no device here (FERROX_REQUIRE_GPU=1 would fail them).
  timeout 400 $D/tests/ferrox_core ${TESTS:-backend::} --skip Vulkan --skip Metal --test-threads=1 --nocapture >/tmp/logs/tests.log 2>&1
  echo "$(el) tests rc=$?: $(grep -E '^test result' /tmp/logs/tests.log | tail -1)"
  grep -E "NOT CHECKED|NOT COMPARED|panicked|FAILED|experts block vs|: seed " /tmp/logs/tests.log | cut -c1-300 | head -24
  # SABOTAGE=1: the experts block test again on a build whose moe_route
  # drops the routing weights' scale; it must fail.
  if [ "${SABOTAGE:-0}" = 1 ] && [ -x $D/tests-sabotaged/ferrox_core ]; then
    timeout 200 $D/tests-sabotaged/ferrox_core backend::conformance::Cuda::suite::moe_block --test-threads=1 >/tmp/logs/tests-sabotaged.log 2>&1
    echo "$(el) SABOTAGED experts test rc=$?: $(grep -E '^test result' /tmp/logs/tests-sabotaged.log | tail -1)"
    grep -E "panicked" -A1 /tmp/logs/tests-sabotaged.log | head -3
  fi
fi

M=/tmp/models
mkdir -p $M
export PYTHONPATH=$PWD/$D
cat >$M/synth.py <<'EOF'
import sys
import make_synthetic_gguf as m
m.SHAPES["qwen3moe-30b-l8"] = dict(m.SHAPES["qwen3moe-30b"], layers=8)
sys.exit(m.main())
EOF
# One figure a line: a bench line with the model, kind, engine and the bytes a token
# reads. (A file, not a here-document: the bench lines arrive on stdin.)
cat >$M/record.py <<'EOF'
import json, sys
shape, kind, bytes_line, engine = sys.argv[1:5]
for line in sys.stdin:
    line = line.strip()
    if not line.startswith("{"):
        continue
    d = json.loads(line)
    d["model"] = f"{shape} (synthetic, seed 0)"
    d["kind"] = kind
    d["engine"] = engine
    d["bytes_per_token"] = bytes_line
    print(json.dumps(d))
EOF
for shape in ${SHAPES:-qwen3moe-tiny qwen3moe-30b-l8}; do
  python3 $M/synth.py --shape $shape --out $M/$shape-F16.gguf --seed 0 --jobs 16 >/tmp/logs/synth-$shape.log 2>&1
  echo "$(el) synthetic $shape F16 rc=$? ($(du -h $M/$shape-F16.gguf | cut -f1))"
  $D/ferrox quantize $M/$shape-F16.gguf $M/$shape-Q4_K_M.gguf Q4_K_M -f >/tmp/logs/quantize-$shape.log 2>&1
  echo "$(el) quantize $shape Q4_K_M rc=$?"
done

prompt="The quick brown fox jumps over the lazy dog and then"
for shape in ${SHAPES:-qwen3moe-tiny qwen3moe-30b-l8}; do
  for k in ${KINDS:-F16 Q4_K_M}; do
    f=$M/$shape-$k.gguf
    bytes=$($D/ferrox kernels "$f" --backend cuda 2>/dev/null | grep -i "per decoded token" | head -1)
    echo "$shape $k: $bytes"
    for be in cpu cuda; do
      $D/ferrox run --backend $be "$f" -p "$prompt" -n 24 --temp 0 --no-echo >/tmp/logs/run-$shape-$k-$be.out 2>/tmp/logs/run-$shape-$k-$be.err
      echo "  $be rc=$?: $(head -c 120 /tmp/logs/run-$shape-$k-$be.out | tr '\n' ' ')"
    done
    cmp -s /tmp/logs/run-$shape-$k-cpu.out /tmp/logs/run-$shape-$k-cuda.out && echo "  greedy: CPU and CUDA identical" || echo "  greedy: CPU and CUDA differ"
    $D/ferrox bench -m "$f" --backend cuda -p 512 -n 128 -r 3 -o jsonl >/tmp/logs/bench-$shape-$k.jsonl 2>/tmp/logs/bench-$shape-$k.err
    echo "  bench rc=$?: $(python3 -c 'import json,sys; print(" ".join("pp%s/tg%s %.1f" % (d.get("n_prompt"), d.get("n_gen"), d.get("avg_ts", 0)) for d in map(json.loads, sys.stdin) if d))' </tmp/logs/bench-$shape-$k.jsonl 2>/dev/null)"
    # BASE=1: the same bench with $D/ferrox-base (an earlier build), in the same call.
    if [ "${BASE:-0}" = 1 ] && [ -x $D/ferrox-base ]; then
      $D/ferrox-base bench -m "$f" --backend cuda -p 512 -n 128 -r 3 -o jsonl >/tmp/logs/bench-base-$shape-$k.jsonl 2>/tmp/logs/bench-base-$shape-$k.err
      echo "  base bench rc=$?: $(python3 -c 'import json,sys; print(" ".join("pp%s/tg%s %.1f" % (d.get("n_prompt"), d.get("n_gen"), d.get("avg_ts", 0)) for d in map(json.loads, sys.stdin) if d))' </tmp/logs/bench-base-$shape-$k.jsonl 2>/dev/null)"
    fi
    # TRACE=1: where a decode step's and a prefill's time goes (tools/cuda/trace.py): $OUT/trace-$shape-$k.txt.
    if [ "${TRACE:-0}" = 1 ]; then
      FERROX_CUDA_DEFINES=FERROX_TRACE=1 FERROX_CUDA_TRACE=/tmp/logs/trace-tg.txt \
        $D/ferrox bench -m "$f" --backend cuda -p 0 -n 16 -r 1 >/dev/null 2>&1
      FERROX_CUDA_DEFINES=FERROX_TRACE=1 FERROX_CUDA_TRACE=/tmp/logs/trace-pp.txt \
        $D/ferrox bench -m "$f" --backend cuda -p 512 -n 0 -r 1 >/dev/null 2>&1
      { echo "== decode"; python3 tools/cuda/trace.py /tmp/logs/trace-tg.txt --positions 0;
        echo "== prefill 512"; python3 tools/cuda/trace.py /tmp/logs/trace-pp.txt --skip 1 --positions 0; } >"$OUT/trace-$shape-$k.txt" 2>&1
      head -c 5000 "$OUT/trace-$shape-$k.txt"
    fi
    # NCU=1: each kernel's own time in a decode step (Nsight Compute, kernels one at a
    # time), ferrox here and llama.cpp below: $OUT/ncu-$shape-$k.txt. A bench of -n 4
    # makes 5 steps (the warmup token and 4).
    if [ "${NCU:-0}" = 1 ]; then
      NCU_BIN=$(command -v ncu || ls /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -1)
      timeout 200 $NCU_BIN --clock-control none --metrics gpu__time_duration.sum --csv \
        $D/ferrox bench -m "$f" --backend cuda -p 0 -n 4 -r 1 >/tmp/logs/ncu-ferrox-$shape-$k.csv 2>&1
      { echo "== ferrox decode, ncu rc=$?"; python3 tools/cuda/ncu_sum.py /tmp/logs/ncu-ferrox-$shape-$k.csv --steps 5; } >"$OUT/ncu-$shape-$k.txt" 2>&1
      head -c 4000 "$OUT/ncu-$shape-$k.txt"
    fi
    for engine in ferrox ferrox-base; do
      src=/tmp/logs/bench-$shape-$k.jsonl
      [ $engine = ferrox-base ] && src=/tmp/logs/bench-base-$shape-$k.jsonl
      [ -f $src ] || continue
      python3 $M/record.py "$shape" "$k" "$bytes" "$engine" <$src >>"$OUT/moe.jsonl"
    done
    echo "$shape $k $bytes" >>/tmp/logs/done.txt
  done
done
# llama.cpp last, once ferrox's figures are safe in $OUT: the same files, llama-bench -fa 1.
if [ -n "$LLPID" ]; then
  wait $LLPID
  echo "$(el) llama.cpp build: $(ls /tmp/llama/.built 2>/dev/null || tail -3 /tmp/logs/llama/llama-build.log)"
fi
if [ -f /tmp/llama/.built ] && [ -f /tmp/logs/done.txt ]; then
  while read -r shape k bytes; do
    f=$M/$shape-$k.gguf
    # ferrox again, now that the build no longer shares the host's cores
    # (decode is bound by launches, so a busy host slows it): both engines quiet.
    $D/ferrox bench -m "$f" --backend cuda -p 512 -n 128 -r 3 -o jsonl >/tmp/logs/bench-quiet-$shape-$k.jsonl 2>/dev/null
    echo "  $shape $k ferrox bench, quiet host: $(python3 -c 'import json,sys; print(" ".join("pp%s/tg%s %.1f" % (d.get("n_prompt"), d.get("n_gen"), d.get("avg_ts", 0)) for d in map(json.loads, sys.stdin) if d))' </tmp/logs/bench-quiet-$shape-$k.jsonl 2>/dev/null)"
    python3 $M/record.py "$shape" "$k" "$bytes" ferrox-quiet </tmp/logs/bench-quiet-$shape-$k.jsonl >>"$OUT/moe.jsonl"
    if [ "${BASE:-0}" = 1 ] && [ -x $D/ferrox-base ]; then
      $D/ferrox-base bench -m "$f" --backend cuda -p 512 -n 128 -r 3 -o jsonl >/tmp/logs/bench-base-quiet-$shape-$k.jsonl 2>/dev/null
      echo "  $shape $k ferrox-base bench, quiet host: $(python3 -c 'import json,sys; print(" ".join("pp%s/tg%s %.1f" % (d.get("n_prompt"), d.get("n_gen"), d.get("avg_ts", 0)) for d in map(json.loads, sys.stdin) if d))' </tmp/logs/bench-base-quiet-$shape-$k.jsonl 2>/dev/null)"
      python3 $M/record.py "$shape" "$k" "$bytes" ferrox-base-quiet </tmp/logs/bench-base-quiet-$shape-$k.jsonl >>"$OUT/moe.jsonl"
    fi
    timeout 240 /tmp/llama/bin/llama-bench -m "$f" -ngl 99 -fa 1 -p 512 -n 128 -r 3 -o jsonl >/tmp/logs/llama-bench-$shape-$k.jsonl 2>/tmp/logs/llama-bench-$shape-$k.err
    echo "  $shape $k llama-bench rc=$?: $(python3 -c 'import json,sys; print(" ".join("pp%s/tg%s %.1f" % (d.get("n_prompt"), d.get("n_gen"), d.get("avg_ts", 0)) for d in map(json.loads, sys.stdin) if d))' </tmp/logs/llama-bench-$shape-$k.jsonl 2>/dev/null)"
    python3 $M/record.py "$shape" "$k" "$bytes" llama.cpp </tmp/logs/llama-bench-$shape-$k.jsonl >>"$OUT/moe.jsonl"
    if [ "${NCU:-0}" = 1 ]; then
      timeout 200 $NCU_BIN --clock-control none --metrics gpu__time_duration.sum --csv \
        /tmp/llama/bin/llama-bench -m "$f" -ngl 99 -fa 1 -p 0 -n 4 -r 1 >/tmp/logs/ncu-llama-$shape-$k.csv 2>&1
      { echo "== llama.cpp decode, ncu rc=$?"; python3 tools/cuda/ncu_sum.py /tmp/logs/ncu-llama-$shape-$k.csv --steps 5; } >>"$OUT/ncu-$shape-$k.txt" 2>&1
      tail -c 4000 "$OUT/ncu-$shape-$k.txt"
    fi
  done </tmp/logs/done.txt
fi
cat "$OUT/moe.jsonl" | cut -c1-400
echo "$(el) done"
mv "$OUT"/*.log /tmp/logs/ 2>/dev/null
tar czf "$OUT/logs.tgz" -C /tmp/logs .
