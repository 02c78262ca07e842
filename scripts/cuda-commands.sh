#!/usr/bin/env bash
# One device-tool call on a GPU machine: the GPU tests (the conformance
# suite's CUDA instance and the CUDA-specific tests), then every subcommand
# that runs a model — run, chat, serve, perplexity, bench, kernels — on CUDA
# beside the CPU on the same synthetic file, so each is seen working where it
# is claimed. Built here and carried in $D (an ignored folder named in the
# device tool's `carry`):
#   $D/ferrox            cargo build --release -p ferrox --features cuda
#   $D/tests/ferrox_core cargo test -p ferrox-core --features cuda --lib --no-run
#   $D/gguf/, $D/make_synthetic_gguf.py   gguf-py and ../shared/tools
#   $D/load_completions.py                ../shared/tools (the server's load client)
#   $D/llama-src.tgz                      optional: the stripped llama.cpp tree; built in the
#                                         background (scripts/cuda-llama-build.sh) for a same-run
#                                         llama-bench beside `ferrox bench`, and llama-quantize's Q4_K_M
# Env: SHAPE (llama-1b), KINDS (bench kinds besides F16: "Q8_0 Q4_0"), CHUNKS (perplexity, 4),
# REPS (5), SKIP_TESTS=1, NGL (also run, chat, perplexity and bench split by layer: the last NGL
# blocks on CUDA), GREEDY=1 (then scripts/cuda-greedy.sh), COMMIT (the commit the carried binaries were built from, for the results).
# Writes $OUT/results.jsonl (the side by side as benchmarks/harness/record.py lines: append them to
# benchmarks/results/cuda-h200.jsonl, then `python3 benchmarks/tables.py`) and $OUT/logs.tgz.
set -u
D=${D:-target/h-cuda}
OUT=${OUT:-/tmp/ferrox-out}
L=$OUT/logs
mkdir -p "$L"
export FERROX_CUDA_CACHE=/tmp/ferrox-cuda-cache HOME=${HOME:-/root} FERROX_REQUIRE_GPU=1
T0=$(date +%s); el() { echo "[$(( $(date +%s) - T0 ))s]"; }
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader | tee "$L/gpu.txt"
F=$D/ferrox
M=/tmp/models; mkdir -p $M

[ -f $D/llama-src.tgz ] && { bash scripts/cuda-llama-build.sh $D "$L/llama" & LLPID=$!; }
# The synthetic model (CPU work) while the GPU tests run.
PYTHONPATH=$PWD/$D python3 $D/make_synthetic_gguf.py --shape "${SHAPE:-llama-1b}" --out $M/F16.gguf --seed 0 --jobs 12 >"$L/synth.log" 2>&1 &
SYN=$!
if [ "${SKIP_TESTS:-0}" != 1 ]; then
  timeout 420 $D/tests/ferrox_core backend:: --test-threads=1 --nocapture >"$L/tests.log" 2>&1
  echo "$(el) GPU tests rc=$?: $(grep -E '^test result' "$L/tests.log" | tail -1)"
  grep -E "^test .*(FAILED|ok)$" "$L/tests.log" | grep -c " ok$" | sed 's/^/  tests ok: /'
  grep -E "NOT CHECKED|panicked|FAILED|max .diff" "$L/tests.log" | head -12
fi
wait $SYN; echo "$(el) synthetic rc=$?"
for k in ${KINDS-Q8_0 Q4_0}; do
  $F quantize $M/F16.gguf $M/$k.gguf $k -t 16 >>"$L/quantize.log" 2>&1 || echo "quantize $k failed"
done
echo "$(el) quantized: $(ls $M)"
Q=$M/${PLAN_KIND:-Q8_0}.gguf

echo "== kernels (the plan, no device opened; then what the loaded model reports)"
$F kernels $Q --backend cuda | tail -6
$F kernels $Q --backend cuda --json >"$L/plan-cuda.json"

echo "== run: greedy, CPU vs CUDA"
P="The old lighthouse keeper climbed the stairs and"
$F run $Q -p "$P" -n 24 --temp 0 --no-echo -t 16 >"$L/run-cpu.txt" 2>"$L/run-cpu.err"; echo "cpu rc=$?"
$F run $Q -p "$P" -n 24 --temp 0 --no-echo --backend cuda -v >"$L/run-cuda.txt" 2>"$L/run-cuda.err"; echo "cuda rc=$?"
grep -h "loading\|ferrox: prompt" "$L/run-cuda.err" | head -3
cmp -s "$L/run-cpu.txt" "$L/run-cuda.txt" && echo "run: identical greedy text" || { echo "run: texts differ"; head -c 300 "$L/run-cpu.txt"; echo; head -c 300 "$L/run-cuda.txt"; echo; }

echo "== chat: two turns, CPU vs CUDA"
for b in cpu cuda; do
  printf 'Hello there\nTell me more\n' | $F chat $Q --temp 0 -n 12 -t 16 --backend $b -v >"$L/chat-$b.txt" 2>"$L/chat-$b.err"
  echo "$b rc=$? turns: $(grep -c 'ferrox: turn' "$L/chat-$b.err")"
done
cmp -s "$L/chat-cpu.txt" "$L/chat-cuda.txt" && echo "chat: identical replies" || echo "chat: replies differ"

echo "== perplexity: CPU vs CUDA, the same chunks"
TXT=benchmarks/data/docutils-peps.txt
for b in cpu cuda; do
  $F perplexity -m $Q -f $TXT -c 512 --chunks ${CHUNKS:-4} -t 16 --backend $b >"$L/ppl-$b.txt" 2>"$L/ppl-$b.err"
  echo "$b rc=$? $(grep 'Final estimate' "$L/ppl-$b.txt")"
done
python3 - "$L/ppl-cpu.txt" "$L/ppl-cuda.txt" <<'EOF'
import re, sys
v = [float(re.search(r"PPL = ([0-9.]+)", open(f).read()).group(1)) for f in sys.argv[1:]]
print(f"perplexity: cpu {v[0]:.4f} cuda {v[1]:.4f} difference {100 * (v[1] - v[0]) / v[0]:+.3f}%")
EOF

if [ -n "${NGL:-}" ]; then
  echo "== split: the last $NGL blocks on CUDA (-ngl $NGL), the rest on the CPU"
  $F kernels $Q -ngl $NGL | grep -E "^backend|crossings"
  $F run $Q -p "$P" -n 24 --temp 0 --no-echo -t 16 -ngl $NGL -v >"$L/run-split.txt" 2>"$L/run-split.err"; echo "run rc=$? $(grep -h 'loading' "$L/run-split.err" | sed 's/.* on //')"
  grep -h "ferrox: prompt" "$L/run-split.err"
  python3 - "$L/run-cpu.txt" "$L/run-cuda.txt" "$L/run-split.txt" <<'EOF'
import sys
t = [open(f).read().split() for f in sys.argv[1:]]
same = lambda a, b: next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))
print(f"greedy tokens the same as the CPU's: cuda {same(t[0], t[1])}/{len(t[0])}, split {same(t[0], t[2])}/{len(t[0])}")
EOF
  printf 'Hello there\nTell me more\n' | $F chat $Q --temp 0 -n 12 -t 16 -ngl $NGL -v >"$L/chat-split.txt" 2>"$L/chat-split.err"
  echo "chat rc=$? turns: $(grep -c 'ferrox: turn' "$L/chat-split.err")"
  $F perplexity -m $Q -f $TXT -c 512 --chunks ${CHUNKS:-4} -t 16 -ngl $NGL >"$L/ppl-split.txt" 2>"$L/ppl-split.err"
  echo "perplexity rc=$? $(grep 'Final estimate' "$L/ppl-split.txt")"
  $F bench -m $Q -p 512 -n 128 -r 3 -t 16 -ngl $NGL -o jsonl 2>/dev/null | python3 -c "
import json, sys
for l in sys.stdin:
    r = json.loads(l)
    if 'avg_ts' in r: print(f\"split bench {'pp512' if r['n_prompt'] else 'tg128'} {r['avg_ts']:.1f} t/s ({r['cpu_isa']})\")"
fi

echo "== serve --backend cuda: completions, chat, concurrent clients"
$F serve $Q --backend cuda --port 8181 --parallel 8 -c 1024 >"$L/serve.log" 2>&1 &
SRV=$!
for i in $(seq 1 120); do curl -sf localhost:8181/health >/dev/null 2>&1 && break; sleep 0.5; done
curl -s localhost:8181/v1/completions -H 'content-type: application/json' \
  -d '{"prompt": "Once upon a time", "max_tokens": 16, "temperature": 0}' | head -c 400; echo
curl -s localhost:8181/v1/chat/completions -H 'content-type: application/json' \
  -d '{"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 8, "temperature": 0}' | head -c 400; echo
timeout 120 python3 $D/load_completions.py http://localhost:8181 8 32 1 2>&1 | tail -4
curl -s localhost:8181/metrics | grep -E "^ferrox_" | head -6
kill -TERM $SRV; wait $SRV; echo "serve exit rc=$? ($(tail -1 "$L/serve.log"))"

echo "== bench: ferrox --backend cuda, then llama-bench (-ngl 99 -fa 1) on the same files"
files=("$M/F16.gguf"); for k in ${KINDS-Q8_0 Q4_0}; do files+=("$M/$k.gguf"); done
if [ -n "${LLPID:-}" ]; then
  wait $LLPID; echo "$(el) llama.cpp build rc=$?"
  [ -x /tmp/llama/bin/llama-quantize ] && /tmp/llama/bin/llama-quantize $M/F16.gguf $M/Q4_K_M.gguf Q4_K_M 16 >"$L/llama-quantize.log" 2>&1 && files+=("$M/Q4_K_M.gguf")
fi
margs=(); for f in "${files[@]}"; do margs+=("-m" "$f"); done
$F bench "${margs[@]}" -p 512 -n 128 -r ${REPS:-5} --backend cuda -o jsonl >"$L/bench.jsonl" 2>"$L/bench.err"
echo "ferrox bench rc=$?"
if [ -x /tmp/llama/bin/llama-bench ]; then
  /tmp/llama/bin/llama-bench "${margs[@]}" -ngl 99 -fa 1 -p 512 -n 128 -r ${REPS:-5} -o jsonl >"$L/llama-bench.jsonl" 2>"$L/llama-bench.err"
  echo "llama-bench rc=$?"
fi
python3 - "$L/bench.jsonl" "$L/llama-bench.jsonl" <<'EOF'
import json, os, sys
def rows(path):
    out = {}
    if not os.path.exists(path):
        return out
    for l in open(path):
        r = json.loads(l)
        if "avg_ts" in r:
            test = f"pp{r['n_prompt']}" if r["n_prompt"] else f"tg{r['n_gen']}"
            out[(os.path.basename(r["model_filename"]), test)] = (r["avg_ts"], r["stddev_ts"])
    return out
f, l = rows(sys.argv[1]), rows(sys.argv[2])
for key in sorted(f):
    (a, sa), ref = f[key], l.get(key)
    side = f"  llama.cpp {ref[0]:9.1f} sd {ref[1]:6.1f}  ratio {a / ref[0]:.2f}x" if ref else ""
    print(f"{key[0]:12} {key[1]:6} ferrox {a:9.1f} sd {sa:6.1f}{side}")
EOF
[ "${GREEDY:-0}" = 1 ] && { echo "== greedy: ferrox CPU / CUDA / split vs llama.cpp CPU / CUDA (scripts/cuda-greedy.sh)"; LOG=$L bash scripts/cuda-greedy.sh; }
raw=$L/side-by-side.raw; : >"$raw"
python3 - "$L/bench.jsonl" "$L/llama-bench.jsonl" "$raw" <<'EOF'
import json, os, sys
with open(sys.argv[3], "w") as out:
    for label, path in (("ferrox", sys.argv[1]), ("llama", sys.argv[2])):
        for l in open(path) if os.path.exists(path) else []:
            r = json.loads(l)
            if "avg_ts" in r:
                out.write(f"{label} {os.path.basename(r['model_filename'])[:-5]} {l.strip()}\n")
EOF
python3 benchmarks/harness/record.py bench --out "$OUT/results.jsonl" --backend cuda --set side-by-side \
  --source scripts/cuda-commands.sh --model "${SHAPE:-llama-1b} (synthetic, seed 0)" \
  --ref "llama=llama.cpp CUDA (-ngl 99 -fa 1)" "$raw" >/dev/null && echo "recorded $(wc -l <"$OUT/results.jsonl") lines"
tar czf "$OUT/logs.tgz" -C "$OUT" logs && rm -rf "$L"
echo "$(el) done"
