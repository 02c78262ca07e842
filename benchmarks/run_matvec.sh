#!/usr/bin/env bash
# Matvec throughput, ferrox beside llama.cpp (ggml's CPU backend), same shapes, same thread counts,
# run back to back on one machine. Prints two markdown tables and appends one normalized line per
# kind, shape and thread count to benchmarks/results/matvec.jsonl (RECORD=0: not; MACHINE labels
# them); `python3 benchmarks/tables.py` regenerates benchmarks/matvec.md's table from them.
#
#   benchmarks/run_matvec.sh [KIND...]        (default: Q8_0 Q4_K Q6_K Q5_0 Q4_0)
#
# Needs the ggml shared libraries of the llama-cpp-python 0.3.36 tree built as the reference vectors'
# generator builds them (tools/refgen: GGML_REF=/root/.cache/ferrox/ggml-ref by default).
# Run it on a quiet machine: any other process on a core halves a figure (and collapses ggml's
# spin-waiting threads).
set -euo pipefail
cd "$(dirname "$0")/.."
kinds=("${@:-Q8_0 Q4_K Q6_K Q5_0 Q4_0}")
read -r -a kinds <<< "${kinds[*]}"
ggml=${GGML_REF:-/root/.cache/ferrox/ggml-ref}
llama=${LLAMA_TREE:-/root/.cache/ferrox/ref/llama_cpp_python-0.3.36/vendor/llama.cpp}
threads=${FERROX_BENCH_THREADS:-1,2}
bin=$(mktemp -d)/ggml_matvec
gcc -O2 -o "$bin" benchmarks/harness/ggml_matvec.c -I"$llama/ggml/include" -L"$ggml/bin" \
  -lggml-base -lggml-cpu -Wl,-rpath,"$ggml/bin"

out=$(mktemp)
{
echo "## llama.cpp (ggml CPU backend), GB/s of weight bytes, median"
echo
echo "| kind | shape | $(echo "$threads" | sed 's/,/t | /g')t |"
echo "|---|---|$(echo "$threads" | sed 's/[0-9]*/---:/g; s/,/|/g')|"
for k in "${kinds[@]}"; do
  name=$(echo "$k" | sed 's/_K$/_K/; s/^Q\([0-9]\)_K/q\1_K/; s/^Q/q/; s/^IQ/iq/; s/^F/f/; s/^BF/bf/')
  case $k in *_K|IQ4_XS) head=768 ;; *) head=640 ;; esac
  for shape in "4096 4096" "262144 $head"; do
    cells=()
    for t in ${threads//,/ }; do cells+=("$("$bin" "$name" $shape "$t")"); done
    echo "| $k | ${shape/ /x} | $(IFS='|'; echo "${cells[*]}" | sed 's/|/ | /g') |"
  done
done
echo
echo "## ferrox"
echo
FERROX_BENCH_THREADS=$threads cargo bench -q -p ferrox-quant --bench matvec -- "${kinds[@]}" 2>/dev/null
} | tee "$out"
if [ "${RECORD:-1}" = 1 ]; then
  python3 benchmarks/harness/record.py matvec --out benchmarks/results/matvec.jsonl --threads "$threads" "$out" > /dev/null
  echo "recorded in benchmarks/results/matvec.jsonl"
fi
