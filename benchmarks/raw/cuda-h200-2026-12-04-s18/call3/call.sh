# session 18 call 3: branch h/cuda22-attno (the decode attention and the F16 output projection in one
# launch, attention_o_f16, while every token attends to at most FERROX_CUDA_ATTN_O_KEYS=256 keys).
# GPU tests; the new test under a sabotaged reduction (KV head 0's partial sums dropped); decode A/B
# against the same build with the launch off (FERROX_CUDA_ATTN_O_KEYS=0) and main (BASE=1): 1b F16
# and 8b F16 at depth 0, 8b F16 at depth 200 (crossing the limit: a second recording), and a trace.
D=target/h-cuda31
R=$OUT
export FERROX_REQUIRE_GPU=1 FERROX_CUDA_CACHE=/tmp/ferrox-cuda-cache
mkdir -p $R/tests
timeout 240 $D/tests/ferrox_core backend:: --test-threads=1 --nocapture >$R/tests/branch.log 2>&1
echo "branch tests rc=$?: $(grep -E '^test result' $R/tests/branch.log | tail -1)"; grep -E "NOT CHECKED|panicked|FAILED" $R/tests/branch.log | head -8
timeout 120 $D/tests-sabotaged/ferrox_core backend::cuda::tests::attention_and backend::cuda::tests::greedy backend::cuda::tests::every_architecture --test-threads=1 >$R/tests/sabotaged.log 2>&1
echo "sabotaged rc=$?: $(grep -E '^test result' $R/tests/sabotaged.log | tail -1)"; grep -E "^test .*FAILED|panicked" $R/tests/sabotaged.log | head -6
OUT=$R/1b D=$D SKIP_TESTS=1 SHAPE=llama-1b KINDS="F16" ROUNDS=2 VARIANTS=";FERROX_CUDA_ATTN_O_KEYS=0;BASE=1" bash scripts/cuda-dev.sh 2>&1 | grep -E "median"
OUT=$R/8b D=$D SKIP_TESTS=1 SHAPE=llama-8b KINDS="F16" ROUNDS=2 VARIANTS=";FERROX_CUDA_ATTN_O_KEYS=0;BASE=1" TRACE_KINDS=F16 bash scripts/cuda-dev.sh 2>&1 | grep -E "median|step|rc="
# depth 200 on the same file (cuda-dev.sh regenerates it; reuse it directly)
for v in "" "FERROX_CUDA_ATTN_O_KEYS=0"; do
  r=$(env $v timeout 120 $D/ferrox bench --backend cuda -m /tmp/models/F16.gguf -p 0 -n 128 -d 200 -r 3 -o jsonl 2>>$R/8b/bench.err | python3 tools/cuda/bench_results.py --sd)
  echo "8b F16 d200 [$v] $r" | tee -a $R/8b/decode-d200.txt
done
cd $R && tar czf ../all.tgz . && rm -rf ./* && mv ../all.tgz .
