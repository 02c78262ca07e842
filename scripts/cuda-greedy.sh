#!/usr/bin/env bash
# Greedy text of every path on the same files, side by side: ferrox on the CPU, on CUDA and
# split by layer (-ngl, the last N blocks on CUDA), and llama.cpp's `llama-simple` on its CPU
# (-ngl 0) and its CUDA (-ngl 99). Synthetic llama-tiny-untied with --std 0.5 (logits ~25,
# wide margins) in F16, Q8_0 and llama-quantize's Q4_K_M and Q4_0, three prompts each: a path
# that leaves llama.cpp's text where llama.cpp's own two paths agree is a defect to chase.
# Needs what scripts/cuda-commands.sh carries ($D/ferrox, gguf-py, make_synthetic_gguf.py) and
# a llama.cpp build with llama-simple and llama-quantize in /tmp/llama/bin
# (scripts/cuda-llama-build.sh). Env: SHAPE (llama-tiny-untied), STD (0.5), N (32), NGL (1).
set -u
D=${D:-target/h-cuda}
OUT=${OUT:-/tmp/ferrox-out}
L=${LOG:-$OUT/logs}; mkdir -p "$L"
F=$D/ferrox LL=/tmp/llama/bin M=/tmp/greedy; mkdir -p $M
PYTHONPATH=$PWD/$D python3 $D/make_synthetic_gguf.py --shape "${SHAPE:-llama-tiny-untied}" --std "${STD:-0.5}" \
  --out $M/F16.gguf --seed 0 >"$L/greedy-synth.log" 2>&1 || { echo "synthetic failed"; exit 1; }
$F quantize $M/F16.gguf $M/Q8_0.gguf Q8_0 >>"$L/greedy-quantize.log" 2>&1
for k in Q4_K_M Q4_0; do
  [ -x $LL/llama-quantize ] && $LL/llama-quantize $M/F16.gguf $M/$k.gguf $k 4 >>"$L/greedy-quantize.log" 2>&1
done
prompts=("Once upon a time" "The capital of France is" "def fibonacci(n):")
python3 - "$F" "$LL" "$M" "${N:-32}" "${NGL:-1}" "$L/greedy.jsonl" "${prompts[@]}" <<'PY'
import json, os, subprocess, sys
F, LL, M, N, NGL, out = sys.argv[1:7]
prompts = sys.argv[7:]
def ferrox(model, prompt, *extra):
    r = subprocess.run([F, "run", model, "-p", prompt, "-n", N, "--temp", "0", "--no-echo", "-t", "8", *extra],
                       capture_output=True, encoding="utf-8", errors="replace", timeout=120)
    return r.stdout.rstrip("\n") if r.returncode == 0 else f"<error {r.stderr.strip().splitlines()[-1:]}>"
def llama(model, prompt, ngl):
    exe = os.path.join(LL, "llama-simple")
    if not os.path.exists(exe):
        return None
    r = subprocess.run([exe, "-m", model, "-n", N, "-ngl", ngl, prompt], capture_output=True, encoding="utf-8", errors="replace", timeout=120)
    # llama-simple prints the prompt's pieces as stored (BOS, "▁" for spaces), then the continuation.
    text, shown = r.stdout.rstrip("\n"), prompt.replace(" ", "\u2581")
    return text[text.find(shown) + len(shown):] if shown in text else f"<unparsed {text[:200]!r}>"
def agree(a, b):
    """Characters the two texts share from the start."""
    n = 0
    while n < min(len(a), len(b)) and a[n] == b[n]:
        n += 1
    return n
rows = []
for kind in ["F16", "Q8_0", "Q4_K_M", "Q4_0"]:
    model = os.path.join(M, f"{kind}.gguf")
    if not os.path.exists(model):
        continue
    for p in prompts:
        t = {"cpu": ferrox(model, p), "cuda": ferrox(model, p, "--backend", "cuda"),
             f"split-ngl{NGL}": ferrox(model, p, "-ngl", NGL),
             "llama-cpu": llama(model, p, "0"), "llama-cuda": llama(model, p, "99")}
        ref = t["llama-cpu"] if t["llama-cpu"] is not None else t["cpu"]
        line = {"kind": kind, "prompt": p, "chars": len(ref),
                "same_as_llama_cpu": {k: agree(v, ref) for k, v in t.items() if v is not None}, "texts": t}
        rows.append(line)
        print(f"{kind:7} {p[:18]:18} " + "  ".join(f"{k} {v}/{len(ref)}" for k, v in line["same_as_llama_cpu"].items()))
with open(out, "w") as f:
    for r in rows:
        f.write(json.dumps(r) + "\n")
PY
