#!/usr/bin/env bash
# Builds llama.cpp's llama-bench, llama-quantize, llama-simple and
# llama-server (CUDA, sm_90; the server without its web UI) on the device
# machine from the stripped tree a call carries ($1/llama-src.tgz, made by
# scripts/llama-src-pack.sh)
# into /tmp/llama/bin, logs in $2; /tmp/llama/.built marks success. About
# four minutes on the H200 host: device-tool call scripts start it in the
# background (`bash scripts/cuda-llama-build.sh $D $LOG & LLPID=$!`) and
# wait for it before the side by side (scripts/cuda-side-by-side.sh sees
# .built and skips its own).
# LLAMA_TARGETS narrows the build (`llama-bench` alone: a call that only benches).
set -u
D=$1 LOG=$2 LL=/tmp/llama
TARGETS=${LLAMA_TARGETS:-llama-bench llama-quantize llama-simple llama-server}
mkdir -p $LL/src $LOG
tar xzf $D/llama-src.tgz -C $LL/src && cd $LL/src && { [ -f CMakeLists.txt ] || cd llama.cpp; } &&
  # The stripped tree drops directories the top-level CMakeLists.txt still
  # adds (pocs/, app/): empty ones let it configure.
  for d in pocs app; do [ -d $d ] || { mkdir $d && : >$d/CMakeLists.txt; }; done &&
  cmake -B build -DGGML_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=90 -DLLAMA_CURL=OFF -DLLAMA_BUILD_TESTS=OFF \
    -DLLAMA_BUILD_EXAMPLES=ON -DLLAMA_BUILD_SERVER=ON -DLLAMA_BUILD_UI=OFF -DLLAMA_USE_PREBUILT_UI=OFF -DBUILD_SHARED_LIBS=OFF -DGGML_NATIVE=OFF \
    -DCMAKE_BUILD_TYPE=Release >$LOG/llama-cmake.log 2>&1 &&
  nice cmake --build build --target $TARGETS -j14 >$LOG/llama-build.log 2>&1 &&
  mkdir -p $LL/bin && for t in $TARGETS; do cp build/bin/$t $LL/bin/; done && strip $LL/bin/* && touch $LL/.built
