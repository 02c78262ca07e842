# session 18 call 5: h/cuda22-attno with attention_o_f16's shared memory capped
# (FERROX_CUDA_ATTN_O_SMEM bytes; call 4 used the whole 227 KiB: suspect, the SM's L1 carveout left
# too small for the matvecs after it). 8b F16 decode A/B and traces at the cap and without.
D=target/h-cuda31
R=$OUT
export FERROX_REQUIRE_GPU=1 FERROX_CUDA_CACHE=/tmp/ferrox-cuda-cache
OUT=$R/8b D=$D SKIP_TESTS=1 SHAPE=llama-8b KINDS="F16" ROUNDS=2 VARIANTS="FERROX_CUDA_ATTN_O_SMEM=140000;FERROX_CUDA_ATTN_O_SMEM=90000;;FERROX_CUDA_ATTN_O_KEYS=0" bash scripts/cuda-dev.sh 2>&1 | grep -E "median|step|rc="
for v in FERROX_CUDA_ATTN_O_SMEM=140000 FERROX_CUDA_ATTN_O_KEYS=0; do
  env $v FERROX_CUDA_DEFINES=FERROX_TRACE=1 FERROX_CUDA_TRACE=$R/8b/trace-$v.txt timeout 120 $D/ferrox bench --backend cuda -m /tmp/models/F16.gguf -p 0 -n 16 -r 1 >/dev/null 2>>$R/8b/trace.err
  python3 tools/cuda/trace.py $R/8b/trace-$v.txt --positions 6 > $R/8b/trace-$v.summary; head -9 $R/8b/trace-$v.summary
done
rm -f $R/8b/trace-*.txt
cd $R && tar czf ../all.tgz . && rm -rf ./* && mv ../all.tgz .
