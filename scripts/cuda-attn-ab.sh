# FERROX_CUDA_GQA_MIN A/B: $D/ferrox must be built with --features cuda,measure (a measuring
# knob, read only by such a build: docs/dev/configuration.md; scripts/cuda-side-by-side.sh's layout).
set -u
D=target/h-cuda; M=/tmp/models; mkdir -p $M; export PYTHONPATH=$PWD/$D HOME=${HOME:-/root}
python3 $D/make_synthetic_gguf.py --shape llama-1b --out $M/f16.gguf --seed 0 --jobs 16 >/dev/null 2>&1
$D/ferrox quantize $M/f16.gguf $M/Q4_0.gguf Q4_0 -f >/dev/null 2>&1
prompt=$(printf 'a%.0s' $(seq 1 508))
for f in Q4_0 f16; do for g in 16 1; do
  r=$(FERROX_CUDA_GQA_MIN=$g $D/ferrox bench --backend cuda -m $M/$f.gguf -p 0 -n 128 -r 5 -o jsonl | python3 -c "import json,sys; r=json.loads(sys.stdin.readline()); print('tg128 %.1f +- %.1f' % (r['avg_ts'], r['stddev_ts']))")
  echo "$f GQA_MIN=$g bench: $r"
  FERROX_CUDA_GQA_MIN=$g $D/ferrox run --backend cuda $M/$f.gguf -p "$prompt" -n 128 --ignore-eos --temp 0 --no-echo -c 1024 -v 2>&1 >/dev/null | grep generated | sed "s/^/$f GQA_MIN=$g run: /"
done; done
