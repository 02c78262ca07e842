#!/usr/bin/env bash
# One device-tool call: `ferrox serve --backend cuda` under the GPU-serving
# issue's protocol, and llama-server beside it on the same file and load:
# synthetic llama-8b (make_synthetic_gguf.py --shape llama-8b --seed 0) quantized to Q4_K_M by `ferrox quantize`
# (byte-identical to llama-quantize), `--parallel 64 -c 65536`, then
# ../shared/tools/load_completions.py at 1, 16 and 64 concurrent clients
# (/v1/completions, max_tokens 128, ignore_eos, temperature 0.7, distinct
# seeds, 2 requests each). Device memory is sampled during the load.
# Carried in $D (an ignored folder):
#   $D/ferrox                  cargo build --release -p ferrox --features cuda (stripped)
#   $D/gguf/, $D/make_synthetic_gguf.py, $D/load_completions.py   gguf-py and ../shared/tools
#   $D/llama-src.tgz           optional (scripts/llama-src-pack.sh): llama-server built in the
#                              background while ferrox runs, then run the same way (NO_LLAMA=1: not)
# Env: CLIENTS ("1 16 64"), KIND (Q4_K_M), SHAPE (llama-8b), PARALLEL (64), CTX (65536),
# VARIANTS ("name=VAR=value,VAR=value ...": ferrox again under measuring knobs, set "serve-cuda-ab";
# a first setting BIN=PATH runs another ferrox binary, for an A/B of two builds in one call),
# LLAMA_BUILD_S (420: the llama.cpp build is stopped past it, so a call stays under 10 minutes).
# Results: $OUT/serve.jsonl (one line per client count, ready for
# benchmarks/results/serve.jsonl; COMMIT and MACHINE label it), logs in $OUT/logs.tgz.
set -u
D=${D:-target/devmoe}
OUT=${OUT:-/tmp/ferrox-out}
mkdir -p "$OUT" /tmp/logs /tmp/models
export FERROX_CUDA_CACHE=/tmp/ferrox-cuda-cache HOME=${HOME:-/root}
T0=$(date +%s); el() { echo "[$(( $(date +%s) - T0 ))s]"; }
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader | tee "$OUT/gpu.txt"
# With $D/llama-src.tgz: llama-server built in the background (niced, 14 of the
# host's 16 cores) from the start, while ferrox makes the model and runs — so
# ferrox's figures are taken beside a compile, never the other way round —
# then run on the same file under the same load (the side by side the bar asks for).
LLPID=
[ -f $D/llama-src.tgz ] && [ "${NO_LLAMA:-0}" != 1 ] && { timeout ${LLAMA_BUILD_S:-420} bash scripts/cuda-llama-build.sh $D /tmp/logs/llama & LLPID=$!; }
SHAPE=${SHAPE:-llama-8b} KIND=${KIND:-Q4_K_M}
M=/tmp/models/$SHAPE
# (a file a caller made already, the same way, is taken as it is)
if [ ! -f $M-$KIND.gguf ]; then
  PYTHONPATH=$PWD/$D python3 $D/make_synthetic_gguf.py --shape $SHAPE --out $M-F16.gguf --seed 0 --jobs 16 >/tmp/logs/synth.log 2>&1
  echo "$(el) synthetic $SHAPE F16 rc=$? ($(du -h $M-F16.gguf | cut -f1))"
  if [ "$KIND" != F16 ]; then
    $D/ferrox quantize $M-F16.gguf $M-$KIND.gguf $KIND -f >/tmp/logs/quantize.log 2>&1
    echo "$(el) quantize $KIND rc=$?"
    rm -f $M-F16.gguf
  fi
fi
f=$M-$KIND.gguf
port=8411
# load ENGINE PID: the clients at each level against the server on $port,
# one raw line per level into $OUT/load-ENGINE.txt, device memory sampled.
load() {
  local engine=$1 pid=$2
  for _ in $(seq 600); do curl -sf http://127.0.0.1:$port/health >/dev/null && break; sleep 0.5; done
  echo "$(el) $engine up: $(curl -s http://127.0.0.1:$port/health | head -c 200)"
  nvidia-smi --query-gpu=memory.used --format=csv,noheader,nounits -lms 1000 >/tmp/logs/gpu-mem-$engine.csv 2>/dev/null &
  local smi=$!
  for n in ${CLIENTS:-1 16 64}; do
    # /metrics before and after the level, one file per engine (the device
    # tool brings back a handful of files, not one per level).
    curl -s http://127.0.0.1:$port/metrics | grep -v '^#' | sed "s/^/$n before /" >>"$OUT/metrics-$engine.txt"
    line=$(timeout 240 python3 $D/load_completions.py http://127.0.0.1:$port $n 128 2 2>&1 | tail -1)
    curl -s http://127.0.0.1:$port/metrics | grep -v '^#' | sed "s/^/$n after /" >>"$OUT/metrics-$engine.txt"
    echo "$(el) $engine $line"
    echo "$n $(ps -o rss= -p $pid | tr -d ' ') $line" >>"$OUT/load-$engine.txt"
  done
  kill $smi 2>/dev/null
  echo "$engine device memory used (MiB): min $(sort -n /tmp/logs/gpu-mem-$engine.csv | head -1), max $(sort -n /tmp/logs/gpu-mem-$engine.csv | tail -1)"
  # ferrox's own gauges (ferrox_device_memory_*_bytes, last /metrics read), beside nvidia-smi's.
  grep -h "device_memory" "$OUT/metrics-$engine.txt" 2>/dev/null | tail -2
  kill -TERM $pid; wait $pid; echo "$(el) $engine exit rc=$?"
}
$D/ferrox serve "$f" --backend cuda --port $port --parallel ${PARALLEL:-64} -c ${CTX:-65536} -v >/tmp/logs/serve.log 2>&1 &
load ferrox $!
grep -iE "error|panick" /tmp/logs/serve.log | head -5
# VARIANTS="name=VAR=value,VAR=value ...": ferrox again under each set of
# measuring knobs (a `measure` build reads them), recorded beside the default.
# A variant whose first setting is BIN=PATH runs that binary (another build, beside this one).
for v in ${VARIANTS:-}; do
  name=${v%%=*} envs=${v#*=} bin=$D/ferrox
  case $envs in BIN=*) bin=${envs%%,*}; bin=${bin#BIN=}; envs=${envs#BIN=$bin}; envs=${envs#,} ;; esac
  env ${envs//,/ } $bin serve "$f" --backend cuda --port $port --parallel ${PARALLEL:-64} -c ${CTX:-65536} -v \
    >/tmp/logs/serve-$name.log 2>&1 &
  load ferrox-$name $!
done
# LLAMA_BUILDING=1: the caller started the build (scripts/cuda-mma.sh) and touches
# /tmp/llama-build.done when it ends.
if [ -n "$LLPID" ] || [ "${LLAMA_BUILDING:-0}" = 1 ]; then
  [ -n "$LLPID" ] && wait $LLPID
  while [ "${LLAMA_BUILDING:-0}" = 1 ] && [ ! -f /tmp/llama-build.done ]; do sleep 2; done
  if [ -f /tmp/llama/.built ]; then
    echo "$(el) llama.cpp built"
    /tmp/llama/bin/llama-server -m "$f" -ngl 99 -fa on --parallel ${PARALLEL:-64} -c ${CTX:-65536} --port $port \
      >/tmp/logs/llama-server.log 2>&1 &
    load llama-server $!
  else
    echo "$(el) llama.cpp did not build: $(tail -3 /tmp/logs/llama/llama-build.log /tmp/logs/llama/llama-cmake.log 2>/dev/null)"
  fi
fi
# One line per level for benchmarks/results/serve.jsonl (set "serve-cuda"; COMMIT and MACHINE
# label it: the device's copy has no git).
gpu=$(cut -d, -f1 "$OUT/gpu.txt" | head -1)
python3 - "$OUT" "$KIND" "$SHAPE" "${COMMIT:-unknown}" "${MACHINE:-h100}" "$gpu" >"$OUT/serve.jsonl" <<'PY'
import datetime, json, os, re, sys
out, kind, shape, commit, machine, gpu = sys.argv[1:7]
def levels(engine):
    got = {}
    path = os.path.join(out, f"load-{engine}.txt")
    for line in open(path) if os.path.exists(path) else []:
        n, rss, raw = line.split(" ", 2)
        m = re.search(r"(\d+) tokens in ([\d.]+)s = ([\d.]+) tok/s aggregate, (\d+) ok, (\d+) failed", raw)
        if m:
            got[int(n)] = dict(tok_s=float(m[3]), failed=int(m[5]), rss_kib=int(rss or 0))
    return got
def engine_split(n, engine="ferrox"):
    """ferrox's /metrics over one level: steps, tokens a step, and the busy time's split (s)."""
    def read(when):
        path = os.path.join(out, f"metrics-{engine}.txt")
        vals = {}
        for line in open(path) if os.path.exists(path) else []:
            parts = line.split()
            if len(parts) == 4 and parts[0] == str(n) and parts[1] == when and parts[2].startswith("ferrox_engine_"):
                vals[parts[2][len("ferrox_engine_"):]] = float(parts[3])
        return vals
    a, b = read("before"), read("after")
    d = {k: b[k] - a.get(k, 0.0) for k in b}
    if not d.get("steps_total"):
        return {}
    return dict(steps=int(d["steps_total"]), tokens_per_step=round(d["batch_tokens_total"] / d["steps_total"], 2) if "batch_tokens_total" in d else None,
                busy_s=round(d.get("busy_seconds_total", 0), 3), forward_s=round(d.get("forward_seconds_total", 0), 3),
                sample_s=round(d.get("sample_seconds_total", 0), 3))
def line(n, f, engine, **fields):
    """One level of `engine` as a results line, with its /metrics split where ferrox kept one."""
    d = {"what": "serve_tok_s", "model": f"{shape} (synthetic, seed 0)", "file": f"{shape}-{kind}.gguf", "kind": kind,
         "backend": "cuda", "streams": n, "failures": f["failed"], "stat": "one run", "figure": f["tok_s"], "unit": "tok/s",
         "host_rss_kib": f["rss_kib"], "gpu": gpu, "commit": commit, "machine": machine,
         "date": datetime.date.today().isoformat(), "source": "scripts/cuda-serve.sh", **fields}
    split = engine_split(n, engine)
    if split:
        d["engine"] = split
    return d
fx, ll = levels("ferrox"), levels("llama-server")
for n, f in sorted(fx.items()):
    d = line(n, f, "ferrox", set="serve-cuda" if n in ll else "serve-cuda-solo")
    if n in ll:
        d.update(ref="llama-server", ref_figure=ll[n]["tok_s"], ref_failures=ll[n]["failed"])
    print(json.dumps(d))
for v in os.environ.get("VARIANTS", "").split():
    name, envs = v.split("=", 1)
    for n, f in sorted(levels(f"ferrox-{name}").items()):
        d = line(n, f, f"ferrox-{name}", set="serve-cuda-ab", variant=name, knobs=envs)
        if n in fx:
            d.update(ref="ferrox default", ref_figure=fx[n]["tok_s"], ref_failures=fx[n]["failed"])
        print(json.dumps(d))
PY
cat "$OUT/serve.jsonl" | cut -c1-300
tar czf "$OUT/logs.tgz" -C /tmp/logs .
