# session 18 call 4: h/cuda22-attno with attention_o_f16's grid in one wave (call 3 had 136 blocks of
# one an SM on 132 SMs: a second wave, and the gate/up kernel's blocks waiting behind it). The new test
# and the whole-model GPU tests; decode A/B as call 3 (launch off, main), 1b and 8b F16; 8b trace.
D=target/h-cuda31
R=$OUT
export FERROX_REQUIRE_GPU=1 FERROX_CUDA_CACHE=/tmp/ferrox-cuda-cache
mkdir -p $R/tests
timeout 200 $D/tests/ferrox_core backend::cuda::tests::attention_and backend::cuda::tests::greedy backend::cuda::tests::every_architecture --test-threads=1 --nocapture >$R/tests/branch.log 2>&1
echo "branch tests rc=$?: $(grep -E '^test result' $R/tests/branch.log | tail -1)"; grep -E "NOT CHECKED|panicked|FAILED" $R/tests/branch.log | head -8
OUT=$R/1b D=$D SKIP_TESTS=1 SHAPE=llama-1b KINDS="F16" ROUNDS=2 VARIANTS=";FERROX_CUDA_ATTN_O_KEYS=0;BASE=1" bash scripts/cuda-dev.sh 2>&1 | grep -E "median"
OUT=$R/8b D=$D SKIP_TESTS=1 SHAPE=llama-8b KINDS="F16" ROUNDS=2 VARIANTS=";FERROX_CUDA_ATTN_O_KEYS=0" TRACE_KINDS=F16 bash scripts/cuda-dev.sh 2>&1 | grep -E "median|step|rc="
cd $R && tar czf ../all.tgz . && rm -rf ./* && mv ../all.tgz .
