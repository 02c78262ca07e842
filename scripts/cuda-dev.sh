#!/usr/bin/env bash
# A development call on the H200 (device tool, kind nvidia-h200): GPU tests,
# kernel_bench at decode shapes under env variants, optional ncu sections,
# and decode A/B of env variants on synthetic llama-1b files quantized there
# by `ferrox quantize`. Binaries are built here and carried in $D (see the
# header of scripts/cuda-side-by-side.sh; same layout, every binary with the
# `measure` feature: the variants are measuring knobs).
# Env: SKIP_TESTS=1; KB_SHAPES ("2048x2048 8192x2048 ..."), KB_KINDS (Q4_0,Q4_K,...);
# VARIANTS: ';'-separated env settings compared in every step ("" is the default;
# TEST_VARIANTS those the tests run again under, default VARIANTS),
# e.g. "FERROX_CUDA_MMVQ_ROWS=1;FERROX_CUDA_MMVQ_ROWS=2"; KINDS (Q4_K Q4_0 Q8_0);
# NCU_SHAPE (e.g. 8192x2048): ncu's detailed sections on kernel_bench at that shape;
# REPS (decode repetitions, 3); DEPTH (e.g. "0,4096": tokens in the cache before each tg128, ferrox bench -d); KB_VARIANTS: kernel_bench's own (default VARIANTS);
# TRACE_KINDS (e.g. "Q8_0 F16"): the in-graph kernel timeline of 16 decode steps
# (FERROX_TRACE, tools/cuda/trace.py), TRACE_DEFINES more knobs for it, TRACE_DEPTH
# tokens in the cache first (ferrox bench -d).
set -u
D=${D:-target/h-cuda5}
OUT=${OUT:-/tmp/ferrox-out}
LOG=$OUT; mkdir -p $LOG
export FERROX_CUDA_CACHE=/tmp/ferrox-cuda-cache HOME=${HOME:-/root} FERROX_REQUIRE_GPU=1
# The FERROX_CUDA_* knobs this script sets are read only by a `measure` build
# (docs/dev/configuration.md); a binary without it would ignore them and
# report the default as every variant. Such a binary refuses a bad knob value.
if ! FERROX_CUDA_GRAPHS=not-a-switch $D/ferrox info /nonexistent.gguf 2>&1 | grep -q FERROX_CUDA_GRAPHS; then
  echo "$D/ferrox was not built with --features cuda,measure: its measuring knobs would be ignored" >&2
  exit 2
fi
T0=$(date +%s); el() { echo "[$(( $(date +%s) - T0 ))s]"; }
nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.sm,clocks.mem --format=csv | tee $LOG/gpu.txt
IFS=';' read -r -a VARS <<< "${VARIANTS:-}"
[ ${#VARS[@]} = 0 ] && VARS=("")
# kernel_bench's variants (KB_VARIANTS, default VARIANTS).
IFS=';' read -r -a KBV <<< "${KB_VARIANTS-${VARIANTS:-}}"
[ ${#KBV[@]} = 0 ] && KBV=("")

if [ "${SKIP_TESTS:-0}" != 1 ]; then
  # (FERROX_REQUIRE_GPU=1, exported above, fails a test whose device does
  # not open; --nocapture keeps the NOT CHECKED lines of passing tests)
  timeout 300 $D/tests/ferrox_core backend:: --test-threads=1 --nocapture >$LOG/tests.log 2>&1
  echo "$(el) tests rc=$?: $(grep -E '^test result' $LOG/tests.log | tail -1)"
  grep -E "no CUDA device|NOT CHECKED|panicked|FAILED" $LOG/tests.log | head -8
  if [ "${SABOTAGE:-0}" = 1 ] && [ -x $D/tests-sabotaged/ferrox_core ]; then
    timeout 300 $D/tests-sabotaged/ferrox_core backend:: --test-threads=1 --nocapture >$LOG/tests-sabotaged.log 2>&1
    echo "$(el) SABOTAGED tests rc=$?: $(grep -E '^test result' $LOG/tests-sabotaged.log | tail -1)"
    grep -E "^test .*FAILED|panicked" $LOG/tests-sabotaged.log | head -12
  fi
  # The matvec/GEMM tests again under each non-default variant
  # (TEST_VARIANTS, default VARIANTS: those that change what runs).
  IFS=';' read -r -a TVARS <<< "${TEST_VARIANTS-${VARIANTS:-}}"
  for v in "${TVARS[@]}"; do
    [ -z "$v" ] && continue
    env $v timeout 200 $D/tests/ferrox_core backend::cuda::tests::every_claimed_kind_matvec backend::cuda::tests::streaming backend::cuda::tests::matmul_many backend::cuda::tests::fused backend::cuda::tests::every_architecture backend::cuda::tests::greedy backend::cuda::tests::attention --test-threads=1 >$LOG/tests-variant.log 2>&1
    echo "$(el) matvec tests [$v] rc=$?: $(grep -E '^test result' $LOG/tests-variant.log | tail -1)"
    grep -E "panicked|FAILED" $LOG/tests-variant.log | head -4
  done
fi

for sh in ${KB_SHAPES:-}; do
  for v in "${KBV[@]}"; do
    echo "== $sh [$v]" >>$LOG/kernel_bench.txt
    env $v KB_GEMM=0 timeout 120 $D/kernel_bench ${sh%x*} ${sh#*x} >>$LOG/kernel_bench.txt 2>&1
  done
done
[ -n "${KB_SHAPES:-}" ] && { echo "$(el) kernel_bench"; cat $LOG/kernel_bench.txt | grep -v "^kind\|^device"; }

if [ -n "${NCU_SHAPE:-}" ] && command -v ncu >/dev/null; then
  # ncu's detailed sections for the kernels matching each NCU_KERNELS regex
  # (two launches each) in kernel_bench at NCU_SHAPE, default variant only.
  for kr in ${NCU_KERNELS:-mmvq_q4_k mmvq_glu_q4_k}; do
    KB_GEMM=0 timeout 200 ncu --clock-control none -k "regex:^$kr\$" -c 2 \
      --section SpeedOfLight --section Occupancy --section LaunchStats --section WarpStateStats --section MemoryWorkloadAnalysis --section SchedulerStats \
      $D/kernel_bench ${NCU_SHAPE%x*} ${NCU_SHAPE#*x} >$LOG/ncu-$kr.txt 2>&1
    echo "$(el) ncu $kr rc=$?"
    grep -E "Duration|Memory Throughput|DRAM Throughput|Registers Per|Achieved Occupancy|Theoretical Occupancy|Block Limit|Stall|Warp Cycles Per Issued|Issued Warp|No Eligible|Active Warps Per" $LOG/ncu-$kr.txt | head -24
  done
fi

if [ -n "${KINDS-Q4_K Q4_0 Q8_0}" ]; then
  M=/tmp/models; mkdir -p $M
  export PYTHONPATH=$PWD/$D
  python3 $D/make_synthetic_gguf.py --shape ${SHAPE:-llama-1b} --out $M/f16.gguf --seed 0 --jobs 8 >$LOG/synth.log 2>&1
  echo "$(el) synthetic rc=$?"
  for k in ${KINDS-Q4_K Q4_0 Q8_0}; do
    [ $k = F16 ] || $D/ferrox quantize $M/f16.gguf $M/$k.gguf $k -f >>$LOG/quantize.log 2>&1
    [ $k = F16 ] && ln -sf $M/f16.gguf $M/F16.gguf
    # ROUNDS rounds, the variants' order reversed every other round (runs
    # of one binary differ by more than their own spread between processes).
    order=("${VARS[@]}")
    for ((round = 0; round < ${ROUNDS:-1}; round++)); do
    if (( round % 2 == 1 )); then order=(); for ((i=${#VARS[@]}-1; i>=0; i--)); do order+=("${VARS[i]}"); done; else order=("${VARS[@]}"); fi
    for v in "${order[@]}"; do
      bin=$D/ferrox; case "$v" in *BASE=1*) bin=$D/ferrox-base;; *BASE=2*) bin=$D/ferrox-main;; esac
      r=$(env $v timeout 120 $bin bench --backend cuda -m $M/$k.gguf -p ${PP:-0} -n 128 ${DEPTH:+-d $DEPTH} -r ${REPS:-3} -o jsonl 2>>$LOG/bench.err |
        python3 tools/cuda/bench_results.py --sd)
      echo "$k [$v] $r" | tee -a $LOG/decode.txt
    done
    done
  done
  # Medians over the rounds, per kind and variant.
  python3 - $LOG/decode.txt <<'PY'
import re, sys, statistics, collections
d = collections.defaultdict(list)
for line in open(sys.argv[1]):
    m = re.match(r"(\S+) \[(.*)\] (.*)", line)
    if not m: continue
    for t, x in re.findall(r"(tg128(?:@d\d+)?) ([0-9.]+)", m.group(3)):
        d[(m.group(1), m.group(2), t)].append(float(x))
for (k, v, t), xs in d.items():
    print(f"median {k} [{v}] {t} {statistics.median(xs):.1f} over {len(xs)}: {' '.join('%.0f' % x for x in xs)}")
PY
fi
if [ -n "${PROFILE_DECODE:-}" ] && command -v ncu >/dev/null; then
  # Per-kernel GPU time of 16 decode steps, warm caches (as in a real step).
  for k in $PROFILE_DECODE; do
    timeout 200 ncu --clock-control none --cache-control none --metrics gpu__time_duration.sum --print-summary per-kernel \
      $D/ferrox bench --backend cuda -m $M/$k.gguf -p 0 -n 16 -r 1 >$LOG/ncu-decode-$k.txt 2>&1
    echo "$(el) ncu decode $k rc=$?"
    grep -E "Invocations|gpu__time_duration" $LOG/ncu-decode-$k.txt | paste - - | sed -E 's/, Device 0, CC 9.0//; s/gpu__time_duration.sum//; s/[[:space:]]+/ /g' | head -40
  done
fi
if [ -n "${TRACE_KINDS:-}" ]; then
  # The in-graph timeline of 16 decode steps (kernels compiled with
  # FERROX_TRACE; TRACE_DEFINES adds knobs), summed per kernel by
  # tools/cuda/trace.py.
  for k in $TRACE_KINDS; do
    FERROX_CUDA_DEFINES="FERROX_TRACE=1${TRACE_DEFINES:+,$TRACE_DEFINES}" FERROX_CUDA_TRACE=$LOG/trace-$k.txt \
      timeout 120 $D/ferrox bench --backend cuda -m $M/$k.gguf -p 0 -n 16 ${TRACE_DEPTH:+-d $TRACE_DEPTH} -r 1 >/dev/null 2>>$LOG/trace.err
    echo "$(el) trace $k rc=$?"
    python3 tools/cuda/trace.py $LOG/trace-$k.txt --positions 12 | tee $LOG/trace-$k.summary
  done
fi
echo "$(el) end"
