#!/usr/bin/env bash
# The Vulkan backend on NVIDIA's driver (issue 29 item 5), in two steps.
#
#   scripts/vulkan-h200.sh prepare     on the CPU machine: fills $D (default target/devvk, an
#                                      ignored folder, ~45 MiB) with what the device run needs
#   scripts/vulkan-h200.sh             on the GPU machine, through the device tool:
#     carry: ["target/devvk"], command: "COMMIT=<sha> SHAPES=llama-1b bash scripts/vulkan-h200.sh"
#   A device command stops at 10 minutes, so split the work over calls on the warm machine
#   (the .debs are unpacked again each call; a few seconds), e.g.
#     1. COMMIT=<sha> SHAPES=llama-1b bash scripts/vulkan-h200.sh              (tests, then 1b)
#     2. COMMIT=<sha> SKIP_TESTS=1 SHAPES=llama-8b KINDS="F16 Q8_0" bash scripts/vulkan-h200.sh
#     3. COMMIT=<sha> SKIP_TESTS=1 SHAPES=llama-8b KINDS=Q4_0 bash scripts/vulkan-h200.sh
#   and append each call's $OUT/vulkan-h200.jsonl to benchmarks/results/vulkan.jsonl.
#
# What `prepare` puts in $D (the device has no network):
#   debs/          Debian's libvulkan1 libglvnd0 libgl1 libglx0 libegl1 libopengl0 libgles2
#                  (`apt-get download`): NVIDIA's Vulkan driver needs the loader and glvnd; without
#                  glvnd the loader says "Found no drivers"
#   ferrox         stripped `cargo build --release -p ferrox --features vulkan,cuda,measure`
#                  (measure: FERROX_VULKAN_REPLAY=0 and FERROX_VULKAN_INT_DOT=0 give the
#                  replay-off and float-product figures)
#   ferrox_core    the ferrox-core test binary (`--features vulkan,measure`, stripped): the Vulkan
#                  conformance suite
#   ferrox_vulkan_device   ferrox-vulkan's device test (replay, pipeline cache)
#   gguf/, make_synthetic_gguf.py      llama.cpp's gguf-py and ../shared/tools' generator
#
# The run: unpacks the .debs into / (ldconfig), points the loader at NVIDIA's ICD, runs the
# Vulkan conformance suite and the device test on the GPU (FERROX_REQUIRE_VULKAN=1: a device that
# does not open fails), writes synthetic llama-1b and llama-8b (F16; Q8_0 and Q4_0 by
# `ferrox quantize`), and runs `ferrox bench --backend vulkan` (pp512, tg128) on each, with
# replay off too, with the float products for Q8_0/Q4_0 too (the integer-dot switch), and
# `--backend cuda` beside it on the same file.
# Out: $OUT/vulkan-h200.jsonl (benchmarks/harness/record.py lines, set "vulkan", COMMIT and
# MACHINE label them where the device's copy has no git), $OUT/raw-<shape>.txt, $OUT/logs.tgz.
# Env: SHAPES (default "llama-1b llama-8b"), KINDS (default "F16 Q8_0 Q4_0"), REPS (3),
# SKIP_TESTS=1, NO_CUDA=1.
set -u
D=${D:-target/devvk}

if [ "${1:-}" = prepare ]; then
  set -e
  : "${CARGO_TARGET_DIR:?set CARGO_TARGET_DIR}"
  mkdir -p "$D/debs"
  (cd "$D/debs" && apt-get download libvulkan1 libglvnd0 libgl1 libglx0 libegl1 libopengl0 libgles2)
  cargo build -j2 --release -p ferrox --features vulkan,cuda,measure
  strip -o "$D/ferrox" "$CARGO_TARGET_DIR/release/ferrox"
  bin=$(cargo test -j2 --release -p ferrox-core --features vulkan,measure --lib --no-run --message-format=json |
    python3 -c 'import json,sys; print([m["executable"] for m in map(json.loads, sys.stdin) if m.get("executable") and m["target"]["name"]=="ferrox_core"][-1])')
  strip -o "$D/ferrox_core" "$bin"
  bin=$(cargo test -j2 --release -p ferrox-vulkan --test device --no-run --message-format=json |
    python3 -c 'import json,sys; print([m["executable"] for m in map(json.loads, sys.stdin) if m.get("executable")][-1])')
  strip -o "$D/ferrox_vulkan_device" "$bin"
  ref=${LLAMA_SRC:-$HOME/.cache/ferrox/ref/llama_cpp_python-0.3.36/vendor/llama.cpp}
  rm -rf "$D/gguf" && cp -r "$ref/gguf-py/gguf" "$D/gguf"
  cp "${SHARED:-$(dirname "$0")/../../shared}/tools/make_synthetic_gguf.py" "$D/" 2>/dev/null ||
    cp /work/shared/tools/make_synthetic_gguf.py "$D/"
  du -sh "$D"
  exit 0
fi

OUT=${OUT:-/tmp/ferrox-out}
LOG=/tmp/logs
mkdir -p "$OUT" $LOG
T0=$(date +%s); el() { echo "[$(( $(date +%s) - T0 ))s]"; }
export HOME=${HOME:-/root} FERROX_CUDA_CACHE=/tmp/ferrox-cuda-cache FERROX_REQUIRE_VULKAN=1 FERROX_REQUIRE_GPU=1
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader | tee "$OUT/gpu.txt"

# The loader and glvnd, then NVIDIA's ICD (the driver's folder is a read-only mount).
for f in "$D"/debs/*.deb; do dpkg -x "$f" /; done
ldconfig
export VK_DRIVER_FILES=/usr/local/nvidia/share/vulkan/icd.d/nvidia_icd.json
export __EGL_VENDOR_LIBRARY_FILENAMES=/usr/local/nvidia/share/glvnd/egl_vendor.d/10_nvidia.json

if [ "${SKIP_TESTS:-0}" != 1 ]; then
  timeout 300 "$D/ferrox_vulkan_device" --test-threads=1 --nocapture >$LOG/device-test.log 2>&1
  echo "$(el) device test rc=$?: $(grep -E '^test result' $LOG/device-test.log | tail -1)"
  timeout 500 "$D/ferrox_core" conformance::Vulkan backend::vulkan::tests --test-threads=1 --nocapture >$LOG/conformance.log 2>&1
  echo "$(el) conformance rc=$?: $(grep -E '^test result' $LOG/conformance.log | tail -1)"
  grep -E "NOT CHECKED|panicked|FAILED|largest relative|max \|diff\|" $LOG/conformance.log | head -20
fi

M=/tmp/models
mkdir -p $M
export PYTHONPATH=$PWD/$D
REPS=${REPS:-3}
for shape in ${SHAPES:-llama-1b llama-8b}; do
  raw=$OUT/raw-$shape.txt
  : >"$raw"
  python3 "$D/make_synthetic_gguf.py" --shape "$shape" --out "$M/$shape-F16.gguf" --seed 0 --jobs 16 >$LOG/synth-$shape.log 2>&1
  echo "$(el) synthetic $shape F16 rc=$?"
  for k in ${KINDS:-F16 Q8_0 Q4_0}; do
    f=$M/$shape-$k.gguf
    if [ "$k" != F16 ]; then
      "$D/ferrox" quantize "$M/$shape-F16.gguf" "$f" "$k" -f >$LOG/quantize-$shape-$k.log 2>&1
      echo "$(el) quantize $shape $k rc=$?"
    fi
    # Each line of raw.txt: "<label> <kind> <json row of ferrox bench -o jsonl>".
    run_bench() { # label backend [env...]
      local label=$1 be=$2; shift 2
      env "$@" timeout 500 "$D/ferrox" bench -m "$f" --backend "$be" -p 512 -n 128 -r "$REPS" -o jsonl \
        >$LOG/bench-$shape-$k-$label.jsonl 2>$LOG/bench-$shape-$k-$label.err
      echo "$(el) $shape $k $label rc=$?: $(grep -o '"avg_ts":[0-9.]*' $LOG/bench-$shape-$k-$label.jsonl | tr '\n' ' ')"
      grep '^{' $LOG/bench-$shape-$k-$label.jsonl | sed "s/^/$label $k /" >>"$raw"
    }
    run_bench ferrox vulkan
    run_bench vulkan-no-replay vulkan FERROX_VULKAN_REPLAY=0
    case $k in Q8_0 | Q4_0) run_bench vulkan-no-int-dot vulkan FERROX_VULKAN_INT_DOT=0 ;; esac
    [ "${NO_CUDA:-0}" = 1 ] || run_bench cuda cuda
    rm -f "$f.tmp"
    [ "$k" != F16 ] && rm -f "$f"
  done
  rm -f "$M/$shape-F16.gguf"
  # ferrox's Vulkan is the figure; replay-off and ferrox's CUDA are its references.
  MACHINE=${MACHINE:-h200} python3 benchmarks/harness/record.py bench --out "$OUT/vulkan-h200.jsonl" --set vulkan \
    --backend vulkan --model "$shape (synthetic, seed 0)" --ref "vulkan-no-replay=ferrox Vulkan, replay off" \
    --ref "vulkan-no-int-dot=ferrox Vulkan, float products (FERROX_VULKAN_INT_DOT=0)" \
    --ref "cuda=ferrox CUDA" --source scripts/vulkan-h200.sh "$raw" >/dev/null 2>>$LOG/record.err || cat $LOG/record.err
done
cut -c1-300 "$OUT/vulkan-h200.jsonl" 2>/dev/null
tar -czf "$OUT/logs.tgz" -C /tmp logs
