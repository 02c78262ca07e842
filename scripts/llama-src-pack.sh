#!/usr/bin/env bash
# Packs the llama.cpp tree of the llama-cpp-python 0.3.36 sdist for the device machine (no
# network there): everything llama-bench, llama-quantize, llama-simple and llama-server need to
# build with CUDA, without the models, docs, tests, the web UI's sources (llama-server is built
# with LLAMA_BUILD_UI=OFF) and the other ggml backends: ~7 MB, which scripts/cuda-llama-build.sh
# unpacks and builds.
#   scripts/llama-src-pack.sh OUT.tgz     (LLAMA_SRC: the tree; default the CI's sdist copy)
set -euo pipefail
out=${1:?usage: llama-src-pack.sh OUT.tgz}
src=${LLAMA_SRC:-$HOME/.cache/ferrox/ref/llama_cpp_python-0.3.36/vendor/llama.cpp}
[ -f "$src/CMakeLists.txt" ] || { echo "no llama.cpp tree at $src (the CI's .ci/run fetches the sdist)" >&2; exit 1; }
ex=()
for d in models docs tests benches conversion gguf-py tools/ui/src tools/ui/static tools/ui/tests \
  tools/server/tests tools/server/bench; do ex+=(--exclude="llama.cpp/$d"); done
for b in blas cann et hexagon hip metal musa opencl openvino rpc sycl virtgpu vulkan webgpu zdnn zendnn; do
  ex+=(--exclude="llama.cpp/ggml/src/ggml-$b")
done
tar czf "$out" "${ex[@]}" -C "$(dirname "$src")" "$(basename "$src")"
ls -la "$out"
