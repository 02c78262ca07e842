#!/usr/bin/env bash
# One device-tool call on the H200: ferrox's CUDA tests, then ferrox and
# llama.cpp side by side on the same synthetic llama-1b files.
# Everything is built on the CPU machine and carried in $D, an ignored folder
# of the checkout the device tool sends (`target/h-cuda`: the tool's
# `carry: ["target/h-cuda"]`), see benchmarks/cuda.md:
# With the `measure` feature throughout: AB_GRAPHS, AB_VARIANTS and the
# variants of scripts/cuda-dev.sh and cuda-attn-ab.sh set measuring knobs,
# which a build without it does not read (docs/dev/configuration.md; unset,
# they are the defaults a release build is fixed to, so the figures are the same):
#   cargo build --release -p ferrox --features cuda,measure
#   cargo build --release -p ferrox-cuda --features measure --example kernel_bench
#   cargo test --release -p ferrox-core --features cuda,measure --lib --no-run   (-> $D/tests/ferrox_core)
#   cargo test --release -p ferrox-cuda --features measure --no-run             (-> $D/tests/ferrox_cuda*)
#   the same ferrox-core test binary built with sabotaged kernels.cu            (-> $D/tests-sabotaged/)
#   $D/ferrox, $D/kernel_bench, $D/tests/*   stripped release binaries (--features cuda,measure)
#   $D/ferrox-base, $D/ferrox-main            optional: earlier builds, for AB_VARIANTS' BASE=1 and BASE=2
#   $D/gguf/, $D/make_synthetic_gguf.py       gguf-py and ../shared/tools
#   $D/llama-src.tgz                          the stripped llama.cpp tree (llama-bench, llama-quantize)
#   or $D/llama-bin.tgz.*                     a llama.cpp CUDA build brought back by an earlier call (BRING_LLAMA=1)
# Env: DEPTH (e.g. "0,4096": every bench also with that many tokens in the cache, -d of both), SKIP_TESTS=1, SABOTAGE=1 (run $D/tests-sabotaged/* too), STOP_ON_FAIL=1, KINDS, REPS, NO_LLAMA=1,
# LOG (default /tmp/logs), SHAPE (llama-1b), SKIP_KB=1, KB_SHAPES="2048x2048 ..." (kernel_bench at decode shapes too), PROFILE=1 (ncu),
# PROFILE_COLD=0 (only the warm-cache decode profiles), PROFILE_KINDS="Q4_0 F16", AB_GRAPHS=1,
# AB_VARIANTS/AB_KINDS/AB_REPS (below), KB_KINDS (kernel_bench's kinds).
# The side by side's normalized lines (benchmarks/harness/record.py) go to $OUT/results.jsonl
# (set "side-by-side", or "depth" with DEPTH; MACHINE and COMMIT label them where the device's
# copy has no git): append them to benchmarks/results/cuda-h200.jsonl, then
# `python3 benchmarks/tables.py` regenerates benchmarks/cuda.md's tables.
set -u
D=${D:-target/h-cuda}
OUT=${OUT:-/tmp/ferrox-out}
mkdir -p "$OUT"
LOG=${LOG:-/tmp/logs}; mkdir -p $LOG
export FERROX_CUDA_CACHE=/tmp/ferrox-cuda-cache HOME=${HOME:-/root} FERROX_REQUIRE_GPU=1
# The FERROX_CUDA_* knobs this script sets are read only by a `measure` build
# (docs/dev/configuration.md); a binary without it would ignore them and
# report the default as every variant. Such a binary refuses a bad knob value.
if ! FERROX_CUDA_GRAPHS=not-a-switch $D/ferrox info /nonexistent.gguf 2>&1 | grep -q FERROX_CUDA_GRAPHS; then
  echo "$D/ferrox was not built with --features cuda,measure: its measuring knobs would be ignored" >&2
  exit 2
fi
nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.sm,clocks.mem --format=csv >$LOG/gpu.txt 2>&1
cat $LOG/gpu.txt
git log -1 --format='device tree: %h %s' 2>/dev/null
summary=()
T0=$(date +%s)
el() { echo "[$(( $(date +%s) - T0 ))s]"; }
# A bench's JSON lines (ferrox's or llama-bench's, on stdin) as
# "pp512 98543.3  tg128@d4096 927.2".
results() { python3 tools/cuda/bench_results.py 2>&1; }

# llama.cpp: a carried build, else build it now in the background.
LL=/tmp/llama
mkdir -p $LL
if [ "${NO_LLAMA:-0}" = 1 ]; then
  echo "llama.cpp: skipped (NO_LLAMA=1)"
elif [ -f $LL/.built ]; then
  echo "llama.cpp: built earlier in this call"
elif ls $D/llama-bin.tgz.* >/dev/null 2>&1; then
  cat $D/llama-bin.tgz.* | tar xzf - -C $LL && touch $LL/.built && echo "$(el) llama.cpp: carried build"
else
  bash scripts/cuda-llama-build.sh $D $LOG &
  LLPID=$!
fi

if [ "${SKIP_TESTS:-0}" != 1 ]; then
  for set in tests ${SABOTAGE:+tests-sabotaged}; do
    for t in $D/$set/*; do
      name=$set-$(basename "$t")
      filter=""
      case "$name" in *ferrox_core*) filter="backend::";; esac
      # (FERROX_REQUIRE_GPU=1, exported above: a device that does not open
      # fails the GPU tests; --nocapture keeps the NOT CHECKED lines of
      # tests that passed, which are otherwise swallowed)
      timeout 300 "$t" $filter --test-threads=1 --nocapture >"$LOG/$name.log" 2>&1
      rc=$?
      summary+=("$name rc=$rc: $(grep -E '^test result' "$LOG/$name.log" | tail -1)")
      grep -E "no CUDA device|NOT CHECKED|panicked|FAILED" "$LOG/$name.log" | head -8 | sed "s/^/  $name: /"
      [ $set = tests ] && [ $rc != 0 ] && failed=1
    done
  done
  echo "$(el) tests done"
  # STOP_ON_FAIL=1: a failing test ends the call here (no benchmark of
  # wrong kernels; the llama.cpp build is stopped).
  if [ "${STOP_ON_FAIL:-0}" = 1 ] && [ "${failed:-0}" = 1 ]; then
    pkill -f "cmake --build" 2>/dev/null; [ -n "${LLPID:-}" ] && kill $LLPID 2>/dev/null
    printf '%s\n' "${summary[@]}" | tee $LOG/summary.txt
    tar czf "$OUT/logs.tgz" -C $LOG .
    echo "$(el) stopped: a test failed"
    exit 1
  fi
fi

if [ -x $D/kernel_bench ] && [ "${SKIP_KB:-0}" != 1 ]; then
  timeout 150 $D/kernel_bench ${KB_ARGS:-} >$LOG/kernel_bench.txt 2>&1
  summary+=("kernel_bench rc=$?")
  # KB_SHAPES="2048x2048 8192x2048": the decode shapes too (L2-resident
  # when small: two copies alternate, so these read partly from L2).
  for sh in ${KB_SHAPES:-}; do
    echo "== ${sh}" >>$LOG/kernel_bench.txt
    timeout 100 $D/kernel_bench ${sh%x*} ${sh#*x} >>$LOG/kernel_bench.txt 2>&1
  done
  echo "$(el) kernel_bench done"
fi

M=/tmp/models; rm -rf $M; mkdir -p $M
export PYTHONPATH=$PWD/$D
python3 $D/make_synthetic_gguf.py --shape ${SHAPE:-llama-1b} --out $M/f16.gguf --seed 0 --jobs 8 --sha256 >$LOG/synth.log 2>&1
summary+=("synthetic ${SHAPE:-llama-1b} f16: rc=$? $(grep -i sha256 $LOG/synth.log | tail -1)")
echo "$(el) synthetic model made"

if [ -n "${LLPID:-}" ]; then wait $LLPID; fi
echo "$(el) llama.cpp ready: $(ls $LL/.built 2>/dev/null)"
if [ -f $LL/.built ] && [ "${BRING_LLAMA:-0}" = 1 ]; then
  tar czf - -C $LL bin | split -b 15m - $OUT/llama-bin.tgz.
  ls -la $OUT
fi

files=(); [ "${NO_F16:-0}" = 1 ] || files=(F16:$M/f16.gguf)
for k in ${KINDS:-Q4_K_M Q8_0 Q4_0}; do
  if [ -f $LL/.built ]; then
    $LL/bin/llama-quantize $M/f16.gguf $M/$k.gguf $k 16 >>$LOG/quantize.log 2>&1
  else
    fk=$k; [ $k = Q4_K_M ] && fk=Q4_K
    $D/ferrox quantize $M/f16.gguf $M/$k.gguf $fk -f >>$LOG/quantize.log 2>&1
  fi
  files+=("$k:$M/$k.gguf")
done
echo "$(el) quantized"
for kf in "${files[@]}"; do
  k=${kf%%:*}; f=${kf#*:}
  $D/ferrox kernels "$f" 2>/dev/null | grep -i "per decoded token\|crossings" | sed "s/^/$k: /" >>$LOG/bytes.txt
  timeout 120 $D/ferrox bench --backend cuda -m "$f" -p 512 -n 128 ${DEPTH:+-d $DEPTH} -r ${REPS:-5} -o jsonl >$LOG/ferrox-$k.jsonl 2>$LOG/ferrox-$k.err
  summary+=("ferrox $k rc=$?: $(results <$LOG/ferrox-$k.jsonl)")
  if [ -f $LL/.built ]; then
    timeout 120 $LL/bin/llama-bench -m "$f" -ngl 99 -fa 1 -p 512 -n 128 ${DEPTH:+-d $DEPTH} -r ${REPS:-5} -o jsonl >$LOG/llama-$k.jsonl 2>$LOG/llama-$k.err
    summary+=("llama.cpp $k rc=$?: $(results <$LOG/llama-$k.jsonl)")
  fi
  echo "$(el) $k benched"
done
if [ -f $LL/.built ]; then
  raw=$LOG/side-by-side.raw; : >$raw
  for kf in "${files[@]}"; do
    k=${kf%%:*}
    sed "s/^/ferrox $k /" $LOG/ferrox-$k.jsonl >>$raw
    sed "s/^/llama $k /" $LOG/llama-$k.jsonl >>$raw
  done
  python3 benchmarks/harness/record.py bench --out $OUT/results.jsonl --backend cuda \
    --set $([ -n "${DEPTH:-}" ] && echo depth || echo side-by-side) --source scripts/cuda-side-by-side.sh \
    --model "${SHAPE:-llama-1b} (synthetic, seed 0)" --ref "llama=llama.cpp CUDA (-ngl 99 -fa 1)" $raw >/dev/null
  summary+=("recorded: $(wc -l <$OUT/results.jsonl) lines in \$OUT/results.jsonl")
fi
if [ "${PROFILE:-0}" = 1 ] && command -v ncu >/dev/null; then
  # Per-kernel GPU time of one prefill and of 16 decode steps (Q4_0), and
  # decode with the CUDA graphs off, for the A/B. PROFILE_COLD=0 skips
  # the cold-cache runs (ncu flushes the caches between kernels).
  if [ "${PROFILE_COLD:-1}" = 1 ]; then
    timeout 150 ncu --clock-control none --metrics gpu__time_duration.sum --print-summary per-kernel \
      $D/ferrox bench --backend cuda -m $M/Q4_0.gguf -p 512 -n 0 -r 1 >$LOG/ncu-pp.txt 2>&1
    timeout 150 ncu --clock-control none --metrics gpu__time_duration.sum --print-summary per-kernel \
      $D/ferrox bench --backend cuda -m $M/Q4_0.gguf -p 0 -n 16 -r 1 >$LOG/ncu-tg.txt 2>&1
  fi
  # Warm caches (no flush between kernels), as in a real decode step: the
  # weights are cold anyway (each token streams far more than the L2).
  for k in ${PROFILE_KINDS:-Q4_0}; do
    f=$M/$k.gguf; [ $k = F16 ] && f=$M/f16.gguf
    timeout 150 ncu --clock-control none --cache-control none --metrics gpu__time_duration.sum --print-summary per-kernel \
      $D/ferrox bench --backend cuda -m $f -p 0 -n 16 -r 1 >$LOG/ncu-tg-warm-$k.txt 2>&1
  done
  FERROX_CUDA_GRAPHS=0 timeout 60 $D/ferrox bench --backend cuda -m $M/Q4_0.gguf -p 0 -n 128 -r 3 >$LOG/nographs.txt 2>&1
  echo "$(el) profiled"
  grep -c "gpu__time_duration" $LOG/ncu-*.txt
  cat $LOG/nographs.txt
fi
if [ "${AB_GRAPHS:-0}" = 1 ]; then
  # The same decode with the CUDA graphs off (each step's launches enqueued one by one).
  FERROX_CUDA_GRAPHS=0 timeout 60 $D/ferrox bench --backend cuda -m $M/Q4_0.gguf -p 0 -n 128 -r ${REPS:-5} -o jsonl >$LOG/ferrox-Q4_0-nographs.jsonl 2>&1
  summary+=("ferrox Q4_0 graphs off rc=$?: tg128 $(python3 -c "import json; print('%.1f' % json.loads(open('$LOG/ferrox-Q4_0-nographs.jsonl').readline())['avg_ts'])" 2>&1)")
fi
# AB_VARIANTS="FERROX_CUDA_DEC_MAX=0;FERROX_CUDA_FUSE=0": ferrox again under each
# env setting (';'-separated) on the AB_KINDS files, for attributing the
# ratios above to the changes that the settings turn off; a variant with
# BASE=1 runs $D/ferrox-base (an earlier build) instead.
IFS=';' read -r -a ABV <<< "${AB_VARIANTS:-}"
for v in "${ABV[@]}"; do
  [ -z "$v" ] && continue
  for k in ${AB_KINDS:-Q4_K_M}; do
    f=$M/$k.gguf; [ $k = F16 ] && f=$M/f16.gguf
    bin=$D/ferrox; case "$v" in *BASE=1*) bin=$D/ferrox-base;; *BASE=2*) bin=$D/ferrox-main;; esac
    r=$(env $v timeout 60 $bin bench --backend cuda -m $f -p 512 -n 128 ${DEPTH:+-d $DEPTH} -r ${AB_REPS:-3} -o jsonl 2>>$LOG/ab.err | results)
    summary+=("ferrox $k [$v]: $r")
  done
done
if [ "${RUN_CHECK:-1}" = 1 ]; then
  prompt=$(printf 'a%.0s' $(seq 1 508))
  $D/ferrox run --backend cuda $M/Q4_0.gguf -p "$prompt" -n 128 --ignore-eos --temp 0 --no-echo -c 1024 -v >$LOG/run.out 2>$LOG/run.err
  summary+=("ferrox run Q4_0 rc=$?: $(grep generated $LOG/run.err | sed 's/^ferrox: //')")
fi
cat $LOG/bytes.txt 2>/dev/null
cat $LOG/kernel_bench.txt 2>/dev/null
printf '%s\n' "${summary[@]}" | tee $LOG/summary.txt
tar czf "$OUT/logs.tgz" -C $LOG .
echo "$(el) end"
