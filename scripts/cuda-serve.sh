#!/usr/bin/env bash
# One device-tool call on the H200: `ferrox serve --backend cuda` under the
# GPU-serving issue's protocol — synthetic llama-8b (make_synthetic_gguf.py
# --shape llama-8b --seed 0) quantized to Q4_K_M by `ferrox quantize`
# (byte-identical to llama-quantize), `--parallel 64 -c 65536`, then
# ../shared/tools/load_completions.py at 1, 16 and 64 concurrent clients
# (/v1/completions, max_tokens 128, ignore_eos, temperature 0.7, distinct
# seeds, 2 requests each). Device memory is sampled during the load.
# Carried in $D (an ignored folder):
#   $D/ferrox                  cargo build --release -p ferrox --features cuda (stripped)
#   $D/gguf/, $D/make_synthetic_gguf.py, $D/load_completions.py   gguf-py and ../shared/tools
# Env: CLIENTS ("1 16 64"), KIND (Q4_K_M), SHAPE (llama-8b), PARALLEL (64), CTX (65536).
# Results: $OUT/serve.jsonl (one line per client count), logs in $OUT/logs.tgz.
set -u
D=${D:-target/devmoe}
OUT=${OUT:-/tmp/ferrox-out}
mkdir -p "$OUT" /tmp/logs /tmp/models
export FERROX_CUDA_CACHE=/tmp/ferrox-cuda-cache HOME=${HOME:-/root}
T0=$(date +%s); el() { echo "[$(( $(date +%s) - T0 ))s]"; }
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader | tee "$OUT/gpu.txt"
SHAPE=${SHAPE:-llama-8b} KIND=${KIND:-Q4_K_M}
M=/tmp/models/$SHAPE
PYTHONPATH=$PWD/$D python3 $D/make_synthetic_gguf.py --shape $SHAPE --out $M-F16.gguf --seed 0 --jobs 16 >/tmp/logs/synth.log 2>&1
echo "$(el) synthetic $SHAPE F16 rc=$? ($(du -h $M-F16.gguf | cut -f1))"
if [ "$KIND" != F16 ]; then
  $D/ferrox quantize $M-F16.gguf $M-$KIND.gguf $KIND -f >/tmp/logs/quantize.log 2>&1
  echo "$(el) quantize $KIND rc=$?"
  rm -f $M-F16.gguf
fi
f=$M-$KIND.gguf
port=8411
$D/ferrox serve "$f" --backend cuda --port $port --parallel ${PARALLEL:-64} -c ${CTX:-65536} -v >/tmp/logs/serve.log 2>&1 &
pid=$!
for _ in $(seq 300); do curl -sf http://127.0.0.1:$port/health >/dev/null && break; sleep 0.5; done
echo "$(el) server up: $(curl -s http://127.0.0.1:$port/health | head -c 200)"
nvidia-smi --query-gpu=memory.used --format=csv,noheader,nounits -lms 1000 >/tmp/logs/gpu-mem.csv 2>/dev/null &
smi=$!
for n in ${CLIENTS:-1 16 64}; do
  line=$(timeout 240 python3 $D/load_completions.py http://127.0.0.1:$port $n 128 2 2>&1 | tail -1)
  echo "$(el) $line"
  rss=$(ps -o rss= -p $pid | tr -d ' ')
  python3 - "$n" "$line" "$KIND" "$SHAPE" "$rss" >>"$OUT/serve.jsonl" <<'PY'
import json, re, sys
n, line, kind, shape, rss = sys.argv[1:6]
m = re.search(r"(\d+) tokens in ([\d.]+)s = ([\d.]+) tok/s aggregate, (\d+) ok, (\d+) failed", line)
d = {"engine": "ferrox", "backend": "cuda", "model": f"{shape} (synthetic, seed 0)", "kind": kind, "clients": int(n),
     "max_tokens": 128, "rounds": 2, "raw": line, "host_rss_kib": int(rss or 0)}
if m:
    d.update(tokens=int(m[1]), wall_s=float(m[2]), tok_s=float(m[3]), ok=int(m[4]), failed=int(m[5]))
print(json.dumps(d))
PY
done
kill $smi 2>/dev/null
echo "device memory used (MiB): min $(sort -n /tmp/logs/gpu-mem.csv | head -1), max $(sort -n /tmp/logs/gpu-mem.csv | tail -1)"
kill -TERM $pid; wait $pid; echo "$(el) server exit rc=$?"
grep -iE "error|panick" /tmp/logs/serve.log | head -5
tail -3 /tmp/logs/serve.log
cat "$OUT/serve.jsonl" | cut -c1-300
tar czf "$OUT/logs.tgz" -C /tmp/logs .
